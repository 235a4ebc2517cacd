// A minimal SVG writer for the benchmark's pictures (plot.h): shapes and text in user
// units (pixels), every coordinate checked finite so a picture never holds NaN or inf.
// Host code only.
#pragma once

#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace moekit::bench {

// Text with &, <, >, " and ' escaped for XML.
std::string xml_escape(const std::string& s);
// A coordinate or length with one decimal; throws std::logic_error when not finite (a
// plotting bug: every value is checked before it is placed).
std::string svg_num(double v);
// Width of `text` at `size` px in a sans-serif font (an estimate for layout).
double text_width(const std::string& text, double size);

struct TextStyle {
  double size = 12;
  const char* anchor = "start";  // start, middle, end
  const char* fill = "#222";
  bool bold = false;
};

class Svg {
 public:
  // `tooltip` becomes a <title> child: the exact numbers when the picture is opened alone.
  void rect(double x, double y, double w, double h, const std::string& fill,
            const std::string& tooltip = "");
  void line(double x1, double y1, double x2, double y2, const std::string& stroke, double width = 1,
            const std::string& dash = "");
  void polyline(const std::vector<std::pair<double, double>>& pts, const std::string& stroke,
                double width, const std::string& dash = "");
  void circle(double x, double y, double r, const std::string& fill,
              const std::string& tooltip = "");
  void diamond(double x, double y, double r, const std::string& fill,
               const std::string& tooltip = "");
  void polygon(const std::vector<std::pair<double, double>>& pts, const std::string& fill,
               const std::string& tooltip = "");
  void text(double x, double y, const std::string& s, const TextStyle& style = {});
  // Rotated -90 degrees about (x, y): a vertical axis label.
  void vtext(double x, double y, const std::string& s, const TextStyle& style = {});
  // <g> with raw attributes (class, data-*), closed by close_group().
  void open_group(const std::string& attrs);
  void close_group();
  void title(const std::string& s);  // the document's <title>
  // The document: width x height, a white background (legible on dark page themes too),
  // then everything drawn, in order.
  std::string finish(double width, double height) const;

 private:
  std::ostringstream os_;
  std::string title_;
};

}  // namespace moekit::bench
