#include "svg.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>

namespace moekit::bench {

std::string xml_escape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string svg_num(double v) {
  if (!std::isfinite(v)) throw std::logic_error("svg: a coordinate is not finite");
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  std::string s = buf;
  if (s == "-0.0") s = "0.0";
  return s;
}

double text_width(const std::string& text, double size) {
  // DejaVu Sans / Helvetica average about 0.6 em per character; count code points.
  size_t chars = 0;
  for (unsigned char c : text)
    if ((c & 0xC0) != 0x80) ++chars;
  return 0.6 * size * static_cast<double>(chars);
}

namespace {

std::string tooltip_tag(const std::string& tooltip) {
  return tooltip.empty() ? "" : "<title>" + xml_escape(tooltip) + "</title>";
}

// Self-closing, or with a <title> child when there is a tooltip.
std::string close_shape(const std::string& name, const std::string& tooltip) {
  return tooltip.empty() ? "/>\n" : ">" + tooltip_tag(tooltip) + "</" + name + ">\n";
}

}  // namespace

void Svg::rect(double x, double y, double w, double h, const std::string& fill,
               const std::string& tooltip) {
  os_ << "<rect x=\"" << svg_num(x) << "\" y=\"" << svg_num(y) << "\" width=\""
      << svg_num(std::max(0.0, w)) << "\" height=\"" << svg_num(std::max(0.0, h)) << "\" fill=\""
      << fill << "\"" << close_shape("rect", tooltip);
}

void Svg::line(double x1, double y1, double x2, double y2, const std::string& stroke, double width,
               const std::string& dash) {
  os_ << "<line x1=\"" << svg_num(x1) << "\" y1=\"" << svg_num(y1) << "\" x2=\"" << svg_num(x2)
      << "\" y2=\"" << svg_num(y2) << "\" stroke=\"" << stroke << "\" stroke-width=\""
      << svg_num(width) << "\"" << (dash.empty() ? "" : " stroke-dasharray=\"" + dash + "\"")
      << "/>\n";
}

void Svg::polyline(const std::vector<std::pair<double, double>>& pts, const std::string& stroke,
                   double width, const std::string& dash) {
  if (pts.size() < 2) return;
  os_ << "<polyline fill=\"none\" stroke=\"" << stroke << "\" stroke-width=\"" << svg_num(width)
      << "\"" << (dash.empty() ? "" : " stroke-dasharray=\"" + dash + "\"") << " points=\"";
  for (size_t i = 0; i < pts.size(); ++i)
    os_ << (i ? " " : "") << svg_num(pts[i].first) << "," << svg_num(pts[i].second);
  os_ << "\"/>\n";
}

void Svg::circle(double x, double y, double r, const std::string& fill,
                 const std::string& tooltip) {
  os_ << "<circle cx=\"" << svg_num(x) << "\" cy=\"" << svg_num(y) << "\" r=\"" << svg_num(r)
      << "\" fill=\"" << fill << "\"" << close_shape("circle", tooltip);
}

void Svg::diamond(double x, double y, double r, const std::string& fill,
                  const std::string& tooltip) {
  polygon({{x, y - r}, {x + r, y}, {x, y + r}, {x - r, y}}, fill, tooltip);
}

void Svg::polygon(const std::vector<std::pair<double, double>>& pts, const std::string& fill,
                  const std::string& tooltip) {
  os_ << "<polygon fill=\"" << fill << "\" points=\"";
  for (size_t i = 0; i < pts.size(); ++i)
    os_ << (i ? " " : "") << svg_num(pts[i].first) << "," << svg_num(pts[i].second);
  os_ << "\"" << close_shape("polygon", tooltip);
}

void Svg::text(double x, double y, const std::string& s, const TextStyle& style) {
  os_ << "<text x=\"" << svg_num(x) << "\" y=\"" << svg_num(y) << "\" font-size=\""
      << svg_num(style.size) << "\" text-anchor=\"" << style.anchor << "\" fill=\"" << style.fill
      << "\"" << (style.bold ? " font-weight=\"bold\"" : "") << ">" << xml_escape(s) << "</text>\n";
}

void Svg::vtext(double x, double y, const std::string& s, const TextStyle& style) {
  os_ << "<text transform=\"translate(" << svg_num(x) << "," << svg_num(y)
      << ") rotate(-90)\" font-size=\"" << svg_num(style.size) << "\" text-anchor=\""
      << style.anchor << "\" fill=\"" << style.fill << "\">" << xml_escape(s) << "</text>\n";
}

void Svg::open_group(const std::string& attrs) {
  os_ << "<g " << attrs << ">\n";
}

void Svg::close_group() {
  os_ << "</g>\n";
}

void Svg::title(const std::string& s) {
  title_ = s;
}

std::string Svg::finish(double width, double height) const {
  std::ostringstream doc;
  doc << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << svg_num(width) << "\" height=\""
      << svg_num(height) << "\" viewBox=\"0 0 " << svg_num(width) << " " << svg_num(height)
      << "\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\">\n";
  if (!title_.empty()) doc << "<title>" << xml_escape(title_) << "</title>\n";
  doc << "<rect width=\"100%\" height=\"100%\" fill=\"#fff\"/>\n" << os_.str() << "</svg>\n";
  return doc.str();
}

}  // namespace moekit::bench
