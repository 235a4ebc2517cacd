// moekit._moekit: the raw Python binding of moekit's C++ API (nanobind).
//
// It does not link against libtorch. A tensor argument is one of
//   - a tuple (data_ptr, dtype, shape[, strides]): an int pointer, a dtype code (DTYPES)
//     or a registered dtype object (register_dtype), the shape as an int sequence, and
//     strides in elements, or True / None for contiguous, or False for "not contiguous"
//     (rejected). This is the fast path the torch layer uses: no DLPack capsule per call;
//   - any object with __dlpack__ (or a DLPack capsule) that lives on a CUDA device;
//   - None, for an absent optional tensor.
// Every op takes the CUDA stream as an int (cudaStream_t; 0 = the legacy default
// stream) and, where it needs scratch, a workspace pointer and size in bytes (query
// the size with <op>_workspace_size, which takes the same tensors; pointers may be 0).
// Bad input raises moekit.MoekitError (a ValueError) with the C++ message.
#include <Python.h>
#include <cuda_runtime_api.h>
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "moekit/moekit.h"

namespace nb = nanobind;
using nb::arg;
using namespace moekit;

namespace {

constexpr int kDLCUDA = 2;
constexpr int kDLCUDAManaged = 13;

[[noreturn]] void fail(const char* op, const char* arg, const std::string& expected,
                       const std::string& got) {
  throw Error(std::string("moekit::") + op + ": argument '" + arg + "': expected " + expected +
              ", got " + got);
}

std::string type_of(PyObject* o) {
  return Py_TYPE(o)->tp_name;
}

std::string repr_of(PyObject* o) {
  PyObject* r = PyObject_Str(o);
  if (!r) {
    PyErr_Clear();
    return "<" + type_of(o) + ">";
  }
  const char* s = PyUnicode_AsUTF8(r);
  std::string out = s ? s : "?";
  Py_DECREF(r);
  if (!s) PyErr_Clear();
  return out;
}

constexpr const char* kTensorForms =
    "a CUDA tensor (DLPack), a (data_ptr, dtype, shape[, strides]) tuple or None";

// Reads an int from a Python int; fails naming the argument otherwise.
int64_t as_int(PyObject* o, const char* op, const char* arg, const char* what) {
  if (!PyLong_Check(o)) fail(op, arg, std::string("an int ") + what, type_of(o));
  long long v = PyLong_AsLongLong(o);
  if (v == -1 && PyErr_Occurred()) {
    PyErr_Clear();
    fail(op, arg, std::string("an int64 ") + what, repr_of(o));
  }
  return v;
}

// Fills shape or strides from a tuple or list of ints; returns the count.
int read_dims(PyObject* seq, int64_t* out, const char* op, const char* arg, const char* what) {
  if (!PyTuple_Check(seq) && !PyList_Check(seq)) {
    fail(op, arg, std::string("a tuple of ints as ") + what, type_of(seq));
  }
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  if (n > kMaxDims) {
    fail(op, arg, "at most " + std::to_string(kMaxDims) + " dimensions",
         std::to_string(n) + " (" + what + " " + repr_of(seq) + ")");
  }
  PyObject** items = PySequence_Fast_ITEMS(seq);
  for (Py_ssize_t i = 0; i < n; ++i) out[i] = as_int(items[i], op, arg, what);
  return static_cast<int>(n);
}

// Framework dtype objects (torch.bfloat16, ...) registered with their codes, so that a
// tuple can carry t.dtype as it is: an identity compare instead of a dict lookup.
struct RegisteredDType {
  PyObject* obj;
  DType code;
};
constexpr int kMaxRegistered = 16;
RegisteredDType g_registered[kMaxRegistered];
int g_num_registered = 0;

DType dtype_from_code(PyObject* o, const char* op, const char* arg) {
  constexpr const char* kExpected = "a dtype code 1..6 (bf16, f16, f32, i32, fp8e4m3, i64)";
  if (!PyLong_Check(o)) {
    for (int i = 0; i < g_num_registered; ++i) {
      if (g_registered[i].obj == o) return g_registered[i].code;
    }
    // An unregistered dtype object (torch.int64, ...) or its name: say what came.
    fail(op, arg, "dtype bf16, f16, f32, i32, fp8e4m3 or i64", repr_of(o));
  }
  long code = PyLong_AsLong(o);
  if (code < static_cast<long>(DType::kBF16) || code > static_cast<long>(DType::kI64)) {
    if (PyErr_Occurred()) PyErr_Clear();
    fail(op, arg, kExpected, repr_of(o));
  }
  return static_cast<DType>(code);
}

DType dtype_from_dlpack(nb::dlpack::dtype dt, const char* op, const char* arg) {
  using C = nb::dlpack::dtype_code;
  if (dt.lanes == 1) {
    if (dt.code == uint8_t(C::Bfloat) && dt.bits == 16) return DType::kBF16;
    if (dt.code == uint8_t(C::Float) && dt.bits == 16) return DType::kF16;
    if (dt.code == uint8_t(C::Float) && dt.bits == 32) return DType::kF32;
    if (dt.code == uint8_t(C::Int) && dt.bits == 32) return DType::kI32;
    if (dt.code == uint8_t(C::Float8_E4M3FN) && dt.bits == 8) return DType::kFP8E4M3;
    if (dt.code == uint8_t(C::Int) && dt.bits == 64) return DType::kI64;
  }
  fail(op, arg, "dtype bf16, f16, f32, i32, fp8e4m3 or i64",
       "DLPack dtype (code " + std::to_string(dt.code) + ", bits " + std::to_string(dt.bits) +
           ", lanes " + std::to_string(dt.lanes) + ")");
}

// The DLPack C exchange API (dlpack.h >= 1.2: DLPackExchangeAPI) that torch >= 2.9
// publishes as torch.Tensor.__dlpack_c_exchange_api__: dltensor_from_py_object_no_sync
// fills a non-owning DLTensor from a tensor in one C call. Declared here (ABI of
// DLPack major version 1) to stay independent of the dlpack.h that nanobind bundles.
namespace xdl {
struct Device {
  int32_t device_type;
  int32_t device_id;
};
struct DataType {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
};
struct Tensor {
  void* data;
  Device device;
  int32_t ndim;
  DataType dtype;
  int64_t* shape;
  int64_t* strides;
  uint64_t byte_offset;
};
struct ApiHeader {
  uint32_t major;
  uint32_t minor;
  void* prev_api;
};
struct Api {
  ApiHeader header;
  void* managed_tensor_allocator;
  void* managed_tensor_from_py_object_no_sync;
  void* managed_tensor_to_py_object_no_sync;
  int (*dltensor_from_py_object_no_sync)(void* py_object, Tensor* out);
  int (*current_work_stream)(int32_t device_type, int32_t device_id, void** out_stream);
};
}  // namespace xdl
const xdl::Api* g_exchange = nullptr;  // torch.Tensor's, when usable
PyObject* g_exchange_capsule = nullptr;

// The torch layer's tensor type (torch.Tensor, registered by moekit.ops), the names
// of the attributes read from it, and its workspace grow callback.
PyTypeObject* g_tensor_type = nullptr;
PyObject* g_workspace_grow = nullptr;
PyObject* g_launch_ctx_fallback = nullptr;  // the torch layer's Python launch context
bool g_check_devices = true;                // off only in a CPU-only test of the argument plumbing
struct TensorAttrs {
  PyObject* get_device = nullptr;
  PyObject* data_ptr = nullptr;
  PyObject* dtype = nullptr;
  PyObject* shape = nullptr;
  PyObject* is_contiguous = nullptr;
};
// The five, for loops: the member, its name, the kind of C descriptor torch.Tensor has.
struct TensorAttr {
  PyObject* TensorAttrs::*member;
  const char* name;
  PyTypeObject* descr_type;
};
const TensorAttr kTensorAttrs[] = {
    {&TensorAttrs::get_device, "get_device", &PyMethodDescr_Type},
    {&TensorAttrs::data_ptr, "data_ptr", &PyMethodDescr_Type},
    {&TensorAttrs::dtype, "dtype", &PyGetSetDescr_Type},
    {&TensorAttrs::shape, "shape", &PyGetSetDescr_Type},
    {&TensorAttrs::is_contiguous, "is_contiguous", &PyMethodDescr_Type}};
struct Names : TensorAttrs {
  PyObject* exchange_api = nullptr;
} g_names;

// The C descriptors behind those names on torch.Tensor (methods and getsets of
// torch._C.TensorBase), called directly for tensors whose type resolves the five
// names to these same descriptors (torch.Tensor, nn.Parameter, ...): no attribute
// lookup per read. Other types use the generic attribute calls.
TensorAttrs g_descrs;
constexpr int kMaxFastTypes = 8;
PyTypeObject* g_fast_types[kMaxFastTypes] = {};  // checked once, then kept (strong refs)
int g_num_fast_types = 0;

bool same_descriptors(PyTypeObject* t) {
  if (!g_descrs.get_device) return false;
  for (const TensorAttr& a : kTensorAttrs) {
    if (_PyType_Lookup(t, g_names.*a.member) != g_descrs.*a.member) return false;
  }
  return g_exchange_capsule == nullptr ||
         _PyType_Lookup(t, g_names.exchange_api) == g_exchange_capsule;
}

bool is_fast_type(PyTypeObject* t) {
  for (int i = 0; i < g_num_fast_types; ++i) {
    if (g_fast_types[i] == t) return true;
  }
  if (g_num_fast_types == kMaxFastTypes || !same_descriptors(t)) return false;
  Py_INCREF(reinterpret_cast<PyObject*>(t));
  g_fast_types[g_num_fast_types++] = t;
  return true;
}

// A method descriptor called on `self` without arguments / a getset read.
PyObject* call_descr(PyObject* descr, PyObject* self) {
  return PyObject_Vectorcall(descr, &self, 1, nullptr);
}
PyObject* get_descr(PyObject* descr, PyObject* self) {
  return Py_TYPE(descr)->tp_descr_get(descr, self, reinterpret_cast<PyObject*>(Py_TYPE(self)));
}

const char* dl_device_name(int type) {
  switch (type) {
    case 1:
      return "cpu";
    case 2:
      return "cuda";
    case 3:
      return "cuda_host (pinned host memory)";
    case 13:
      return "cuda_managed";
    default:
      return "a non-CUDA device";
  }
}

// Converts the tensor arguments of one call. DLPack imports stay referenced until
// the converter goes out of scope, i.e. until the op has been enqueued.
class Converter {
 public:
  // torch_mode: the torch layer's entry points (_t_<op>), which pass torch tensors as
  // they are; see from_attrs.
  explicit Converter(const char* op, bool torch_mode = false) : op_(op), torch_(torch_mode) {}

  TensorView operator()(nb::handle h, const char* arg) {
    PyObject* o = h.ptr();
    if (o == Py_None) return TensorView{};
    if (torch_) return from_attrs(o, arg);
    if (PyTuple_Check(o)) return from_tuple(o, arg);
    return from_dlpack(h, arg);
  }

  const char* op() const { return op_; }

 private:
  // A torch.Tensor read through a minimal attribute protocol: get_device(),
  // data_ptr(), dtype (a registered dtype object), shape (torch.Size, a tuple) and
  // is_contiguous(). Every tensor must be a CUDA tensor on the device of the first
  // one (the torch layer calls from that device, on its current stream). Cheaper
  // than building (ptr, dtype, shape, contiguous) tuples in Python, and than DLPack.
  TensorView from_attrs(PyObject* o, const char* arg) {
    if (g_tensor_type == nullptr || !PyObject_TypeCheck(o, g_tensor_type)) {
      fail(op_, arg, "a torch.Tensor", type_of(o));
    }
    const bool fast = is_fast_type(Py_TYPE(o));
    if (fast && g_exchange != nullptr) {
      xdl::Tensor dl{};
      if (g_exchange->dltensor_from_py_object_no_sync(o, &dl) == 0) {
        TensorView v;
        if (from_dltensor(dl, o, arg, v)) return v;
      } else {
        PyErr_Clear();  // a tensor DLPack cannot describe: the attribute reads decide
      }
    }
    auto call = [&](PyObject* descr, PyObject* name) {
      PyObject* r = fast ? call_descr(descr, o) : PyObject_CallMethodNoArgs(o, name);
      if (!r) throw nb::python_error();
      return nb::steal(r);
    };
    auto get = [&](PyObject* descr, PyObject* name) {
      PyObject* r = fast ? get_descr(descr, o) : PyObject_GetAttr(o, name);
      if (!r) throw nb::python_error();
      return nb::steal(r);
    };
    check_device(as_int64(call(g_descrs.get_device, g_names.get_device).ptr()), o, arg);
    TensorView v;
    v.data = reinterpret_cast<void*>(
        static_cast<uintptr_t>(as_int64(call(g_descrs.data_ptr, g_names.data_ptr).ptr())));
    v.dtype = dtype_from_code(get(g_descrs.dtype, g_names.dtype).ptr(), op_, arg);
    v.ndim = read_dims(get(g_descrs.shape, g_names.shape).ptr(), v.shape, op_, arg, "shape");
    if (call(g_descrs.is_contiguous, g_names.is_contiguous).ptr() != Py_True) {
      fail(op_, arg, "a contiguous row-major tensor", "a non-contiguous one");
    }
    int64_t s = 1;
    for (int d = v.ndim - 1; d >= 0; --d) {
      v.stride[d] = s;
      s *= v.shape[d];
    }
    return v;
  }

  // The device check shared by both ways of reading a torch tensor.
  void check_device(int64_t dev, PyObject* o, const char* arg) {
    if (!g_check_devices) return;
    if (dev < 0) fail(op_, arg, "a CUDA tensor", "a tensor on " + attr_str(o, "device"));
    if (first_arg_ == nullptr) {
      device_ = dev;
      first_arg_ = arg;
    } else if (dev != device_) {
      fail(op_, arg,
           "a tensor on cuda:" + std::to_string(device_) + " (the device of '" + first_arg_ + "')",
           "cuda:" + std::to_string(dev));
    }
  }

  // Fills v from a DLTensor of the exchange API. Returns false (v untouched) for what
  // the attribute reads must handle and name: a dtype moekit does not take, too many
  // dimensions. Rejects a non-contiguous tensor and checks the device.
  bool from_dltensor(const xdl::Tensor& dl, PyObject* o, const char* arg, TensorView& v) {
    DType dtype = DType::kUndefined;
    if (dl.dtype.lanes == 1) {
      const int code = dl.dtype.code, bits = dl.dtype.bits;
      if (code == 4 && bits == 16) dtype = DType::kBF16;     // kDLBfloat
      if (code == 2 && bits == 16) dtype = DType::kF16;      // kDLFloat
      if (code == 2 && bits == 32) dtype = DType::kF32;      // kDLFloat
      if (code == 0 && bits == 32) dtype = DType::kI32;      // kDLInt
      if (code == 10 && bits == 8) dtype = DType::kFP8E4M3;  // kDLFloat8_e4m3fn
      if (code == 0 && bits == 64) dtype = DType::kI64;      // kDLInt
    }
    if (dtype == DType::kUndefined || dl.ndim < 0 || dl.ndim > kMaxDims) return false;
    const int type = dl.device.device_type;
    check_device(type == kDLCUDA || type == kDLCUDAManaged ? dl.device.device_id : -1, o, arg);
    v.data = static_cast<char*>(dl.data) + dl.byte_offset;
    v.dtype = dtype;
    v.ndim = dl.ndim;
    int64_t numel = 1;
    bool contiguous = true;  // torch's rule: strides of size-1 dims do not matter
    for (int d = v.ndim - 1; d >= 0; --d) {
      v.shape[d] = dl.shape[d];
      if (dl.strides && v.shape[d] != 1 && dl.strides[d] != numel) contiguous = false;
      v.stride[d] = numel;
      numel *= v.shape[d];
    }
    if (!contiguous && numel != 0) {
      fail(op_, arg, "a contiguous row-major tensor", "a non-contiguous one");
    }
    return true;
  }

  static int64_t as_int64(PyObject* r) {
    long long v = PyLong_AsLongLong(r);
    if (v == -1 && PyErr_Occurred()) throw nb::python_error();
    return v;
  }

  static std::string attr_str(PyObject* o, const char* name) {
    PyObject* a = PyObject_GetAttrString(o, name);
    if (!a) {
      PyErr_Clear();
      return "?";
    }
    std::string s = repr_of(a);
    Py_DECREF(a);
    return s;
  }

  TensorView from_tuple(PyObject* t, const char* arg) {
    Py_ssize_t n = PyTuple_GET_SIZE(t);
    if (n != 3 && n != 4) {
      fail(op_, arg, "a (data_ptr, dtype, shape[, strides]) tuple",
           "a tuple of " + std::to_string(n) + " items");
    }
    TensorView v;
    PyObject* p = PyTuple_GET_ITEM(t, 0);
    if (!PyLong_Check(p)) fail(op_, arg, "an int data pointer", type_of(p));
    v.data = PyLong_AsVoidPtr(p);
    if (PyErr_Occurred()) {
      PyErr_Clear();
      fail(op_, arg, "a data pointer that fits 64 bits", repr_of(p));
    }
    v.dtype = dtype_from_code(PyTuple_GET_ITEM(t, 1), op_, arg);
    v.ndim = read_dims(PyTuple_GET_ITEM(t, 2), v.shape, op_, arg, "shape");
    PyObject* st = n == 4 ? PyTuple_GET_ITEM(t, 3) : Py_None;
    if (st == Py_False) {
      // The caller says the tensor is not contiguous (torch's t.is_contiguous()).
      fail(op_, arg, "a contiguous row-major tensor", "a non-contiguous one");
    }
    if (st != Py_None && st != Py_True) {
      int m = read_dims(st, v.stride, op_, arg, "strides");
      if (m != v.ndim) {
        fail(op_, arg, "as many strides as dimensions (" + std::to_string(v.ndim) + ")",
             std::to_string(m));
      }
    } else {
      uint64_t s = 1;  // unsigned: absurd shapes wrap (the C++ checks refuse them), no UB
      for (int d = v.ndim - 1; d >= 0; --d) {
        v.stride[d] = static_cast<int64_t>(s);
        s *= static_cast<uint64_t>(v.shape[d]);
      }
    }
    return v;
  }

  TensorView from_dlpack(nb::handle h, const char* arg) {
    if (n_keep_ == kMaxKeep) fail(op_, arg, "at most 24 DLPack tensors per call", "more");
    nb::ndarray<>& a = keep_[n_keep_];
    if (!nb::try_cast(h, a, /*convert=*/false)) {
      if (PyErr_Occurred()) PyErr_Clear();
      fail(op_, arg, kTensorForms, "an object of type " + type_of(h.ptr()));
    }
    ++n_keep_;
    int dev = a.device_type();
    if (dev != kDLCUDA && dev != kDLCUDAManaged) {
      fail(op_, arg, "a tensor on a CUDA device",
           std::string("a tensor on ") + dl_device_name(dev));
    }
    if (a.ndim() > static_cast<size_t>(kMaxDims)) {
      fail(op_, arg, "at most " + std::to_string(kMaxDims) + " dimensions",
           std::to_string(a.ndim()));
    }
    TensorView v;
    v.data = a.data();
    v.dtype = dtype_from_dlpack(a.dtype(), op_, arg);
    v.ndim = static_cast<int>(a.ndim());
    int64_t s = 1;
    for (int d = v.ndim - 1; d >= 0; --d) {
      v.shape[d] = static_cast<int64_t>(a.shape(d));
      v.stride[d] = a.stride_ptr() ? a.stride(d) : s;
      s *= v.shape[d];
    }
    return v;
  }

  static constexpr int kMaxKeep = 24;
  const char* op_;
  bool torch_ = false;
  int64_t device_ = -1;
  const char* first_arg_ = nullptr;
  nb::ndarray<> keep_[kMaxKeep];
  int n_keep_ = 0;
};

// The torch layer's workspace: a Python list [data_ptr, capacity_bytes, owner, ...] that
// it caches per (device, stream). When the op needs more than the capacity, the
// registered grow callback (moekit.ops) is called with (entry, bytes) and must update
// the entry (a 256-byte aligned pointer and the new capacity) before the op runs.
Workspace workspace_from_entry(nb::handle entry, size_t needed, const char* op) {
  if (needed == 0) return Workspace{};
  PyObject* e = entry.ptr();
  if (!PyList_Check(e) || PyList_GET_SIZE(e) < 2) {
    fail(op, "workspace", "the torch layer's workspace entry (a list)", type_of(e));
  }
  auto capacity = [&] { return PyLong_AsSize_t(PyList_GET_ITEM(e, 1)); };
  size_t cap = capacity();
  if (cap == static_cast<size_t>(-1) && PyErr_Occurred()) throw nb::python_error();
  if (cap < needed) {
    if (g_workspace_grow == nullptr) fail(op, "workspace", "a registered grow callback", "none");
    PyObject* r = PyObject_CallFunction(g_workspace_grow, "On", e, static_cast<Py_ssize_t>(needed));
    if (!r) throw nb::python_error();
    Py_DECREF(r);
    cap = capacity();
    if (cap == static_cast<size_t>(-1) && PyErr_Occurred()) throw nb::python_error();
  }
  void* ptr = PyLong_AsVoidPtr(PyList_GET_ITEM(e, 0));
  if (!ptr && PyErr_Occurred()) throw nb::python_error();
  return Workspace{ptr, cap};
}

cudaStream_t as_stream(uintptr_t s) {
  return reinterpret_cast<cudaStream_t>(s);
}

Workspace as_workspace(uintptr_t ptr, size_t bytes) {
  return Workspace{reinterpret_cast<void*>(ptr), bytes};
}

ScoringFunc parse_scoring(const char* s, const char* op) {
  if (std::strcmp(s, "softmax") == 0) return ScoringFunc::kSoftmax;
  if (std::strcmp(s, "sigmoid") == 0) return ScoringFunc::kSigmoid;
  fail(op, "scoring_func", "'softmax' or 'sigmoid'", std::string("'") + s + "'");
}

Activation parse_activation(const char* s, const char* op) {
  if (std::strcmp(s, "none") == 0) return Activation::kNone;
  if (std::strcmp(s, "silu_and_mul") == 0) return Activation::kSiluAndMul;
  fail(op, "activation", "'none' or 'silu_and_mul'", std::string("'") + s + "'");
}

// The MLP ops' activation, by vLLM's names (docs/python.md).
Activation parse_mlp_activation(const char* s, const char* op) {
  static const struct {
    const char* name;
    Activation act;
  } kNames[] = {{"silu", Activation::kSiluAndMul},
                {"gelu", Activation::kGeluAndMul},
                {"gelu_tanh", Activation::kGeluTanhAndMul},
                {"relu2", Activation::kRelu2},
                {"swigluoai", Activation::kSwigluOai}};
  for (const auto& n : kNames)
    if (std::strcmp(s, n.name) == 0) return n.act;
  fail(op, "activation", "'silu', 'gelu', 'gelu_tanh', 'relu2' or 'swigluoai'",
       std::string("'") + s + "'");
}

Fp8Scales parse_fp8_scales(const char* s, const char* op) {
  if (std::strcmp(s, "block") == 0) return Fp8Scales::kBlock;
  if (std::strcmp(s, "per_channel") == 0) return Fp8Scales::kPerChannel;
  if (std::strcmp(s, "per_tensor") == 0) return Fp8Scales::kPerTensor;
  fail(op, "scales", "'block', 'per_channel' or 'per_tensor'", std::string("'") + s + "'");
}

QuantScheme parse_quant(const char* s, const char* op, const char* arg) {
  QuantScheme q = QuantScheme::kNone;
  if (parse_quant_scheme(s, &q)) return q;
  fail(op, arg, "'none', 'fp8_per_tensor', 'fp8_per_channel' or 'fp8_block128'",
       std::string("'") + s + "'");
}

// ---- fields: one Python argument of an op and where it lands in the C++ args struct ----

// A tensor argument: a TensorView of the args struct (reached through `at`), passed as
// a handle the Converter reads (None: an absent tensor).
template <class At>
struct TensorField {
  using Py = nb::handle;
  const char* name;
  At at;
  template <class A>
  void set(A& a, nb::handle h, Converter& cv) const {
    at(a) = cv(h, name);
  }
  auto arg(bool /*with_default*/) const { return nb::arg(name).none(); }
};

// A scalar argument (int, bool, float, str) that nanobind converts to T; `store` puts it
// into the args struct (parsing strings, naming the op in errors). `dflt`: its default in
// the raw op's signature, used only by ops whose raw signature keeps defaults.
template <class T, class Store>
struct ScalarField {
  using Py = T;
  const char* name;
  Store store;
  std::optional<T> dflt;
  template <class A>
  void set(A& a, T v, Converter& cv) const {
    store(a, v, cv.op());
  }
  nb::arg_v arg(bool with_default) const {  // a null value: no default
    return nb::arg_v(nb::arg(name), with_default && dflt ? nb::cast(*dflt) : nb::object());
  }
};

template <class At>
TensorField<At> tensor(const char* name, At at) {
  return {name, at};
}
template <class T, class Store>
ScalarField<T, Store> scalar(const char* name, Store store, std::optional<T> dflt = {}) {
  return {name, store, dflt};
}
// Keyword fields: trailing arguments with defaults (after the stream and workspace, so every
// positional call keeps its meaning): an optional tensor (None) and a quantization scheme
// name ("none").
template <class At>
struct KeywordTensorField : TensorField<At> {
  auto arg(bool /*with_default*/) const { return nb::arg(this->name) = nb::none(); }
};
template <class Store>
struct KeywordSchemeField : ScalarField<const char*, Store> {
  auto arg(bool /*with_default*/) const { return nb::arg(this->name) = "none"; }
};
// A scalar keyword with its default (a layout, scale mode or activation name).
template <class T, class Store>
struct KeywordScalarField : ScalarField<T, Store> {
  nb::arg_v arg(bool /*with_default*/) const {
    return nb::arg_v(nb::arg(this->name), nb::cast(*this->dflt));
  }
};
template <class T, class Store>
KeywordScalarField<T, Store> keyword_scalar(const char* name, Store store, T dflt) {
  return {{name, store, dflt}};
}
template <class At>
KeywordTensorField<At> keyword_tensor(const char* name, At at) {
  return {{name, at}};
}
template <class Store>
KeywordSchemeField<Store> keyword_scheme(const char* name, Store store) {
  return {{name, store, std::nullopt}};
}

// A WeightQuant (reached as `member`, an expression of the args struct `a`) as five keyword
// arguments: <prefix>weight_quant (a scheme name) and its four scale tensors.
#define MK_QUANT(prefix, member)                                                     \
  keyword_scheme(prefix "weight_quant",                                              \
                 [](auto& a, const char* s, const char* op) {                        \
                   member.scheme = parse_quant(s, op, prefix "weight_quant");        \
                 }),                                                                 \
      keyword_tensor(prefix "w_gate_up_scale",                                       \
                     [](auto& a) -> TensorView& { return member.w_gate_up_scale; }), \
      keyword_tensor(prefix "w_down_scale",                                          \
                     [](auto& a) -> TensorView& { return member.w_down_scale; }),    \
      keyword_tensor(prefix "a_gate_up_scale",                                       \
                     [](auto& a) -> TensorView& { return member.a_gate_up_scale; }), \
      keyword_tensor(prefix "a_down_scale",                                          \
                     [](auto& a) -> TensorView& { return member.a_down_scale; })

// A field of the same name in the args struct.
#define MK_TENSOR(field) tensor(#field, [](auto& a) -> TensorView& { return a.field; })
#define MK_INT(field) scalar<int>(#field, [](auto& a, int v, const char*) { a.field = v; })
// `alignment` as a contiguous(alignment) layout.
#define MK_CONTIGUOUS_LAYOUT \
  scalar<int>("alignment",   \
              [](auto& a, int v, const char*) { a.layout = PermutedLayout::contiguous(v); })

// FusedMoESharedExpertArgs holds a FusedMoEArgs (its routed layer): the fields they share
// reach it through moe_part, the routing parameters through params_of.
template <class A>
A& moe_part(A& a) {
  return a;
}
FusedMoEArgs& moe_part(FusedMoESharedExpertArgs& a) {
  return a.moe;
}
#define MK_MOE_TENSOR(field) \
  tensor(#field, [](auto& a) -> TensorView& { return moe_part(a).field; })
template <class A>
TopKParams& params_of(A& a) {
  return moe_part(a).params;
}
template <class A>
auto workspace_of(A& a) -> decltype((moe_part(a).workspace)) {
  return moe_part(a).workspace;
}
template <class A, class = void>
struct HasWorkspace : std::false_type {};
template <class A>
struct HasWorkspace<A, std::void_t<decltype(workspace_of(std::declval<A&>()))>> : std::true_type {};

// FusedTopKFwd's routing parameters, shared by the ops that route.
auto topk_param_fields() {
  return std::make_tuple(
      scalar<int>("top_k", [](auto& a, int v, const char*) { params_of(a).top_k = v; }),
      scalar<bool>(
          "renormalize", [](auto& a, bool v, const char*) { params_of(a).renormalize = v; }, false),
      scalar<const char*>(
          "scoring_func",
          [](auto& a, const char* s, const char* op) {
            params_of(a).scoring_func = parse_scoring(s, op);
          },
          "softmax"),
      scalar<int>(
          "num_expert_group",
          [](auto& a, int v, const char*) { params_of(a).num_expert_group = v; }, 0),
      scalar<int>(
          "topk_group", [](auto& a, int v, const char*) { params_of(a).topk_group = v; }, 0),
      scalar<float>(
          "routed_scaling_factor",
          [](auto& a, float v, const char*) { params_of(a).routed_scaling_factor = v; }, 1.0f));
}

template <class... F>
auto fields(F... f) {
  return std::make_tuple(f...);
}

// An MLP op's activation (vLLM's name) and optional biases, after its other arguments.
auto activation_fields() {
  return std::make_tuple(scalar<const char*>("activation",
                                             [](auto& a, const char* s, const char* op) {
                                               moe_part(a).activation = parse_mlp_activation(s, op);
                                             }),
                         MK_MOE_TENSOR(gate_up_bias), MK_MOE_TENSOR(down_bias));
}

// The engine inputs of the routed ops (docs/moe.md, "Engine inputs"), after their fields.
auto engine_fields() {
  return std::make_tuple(
      MK_MOE_TENSOR(expert_map),
      scalar<bool>("apply_router_weight_on_input", [](auto& a, bool v, const char*) {
        moe_part(a).apply_router_weight_on_input = v;
      }));
}

// The routed-experts ops' arguments (FusedMoEExpertsFwd, IndexedExpertMLPFwd).
auto experts_fields() {
  return std::tuple_cat(fields(MK_TENSOR(hidden_states), MK_TENSOR(w_gate_up), MK_TENSOR(w_down),
                               MK_TENSOR(topk_weights), MK_TENSOR(topk_ids), MK_TENSOR(output)),
                        activation_fields(), engine_fields());
}

// ---- ops: one entry per op; register_op generates its Python functions ----

enum class WorkspaceUse { kNone, kRequired, kOptional };

template <class Args, class Fields, class Keywords = std::tuple<>>
struct Op {
  const char* name;  // moekit.raw.<name>, moekit.raw._t_<name>, torch.ops.moekit.<name>
  void (*run)(const Args&, cudaStream_t);
  const char* doc;
  Fields fields;  // the Python arguments in order (C++ field order)
  size_t (*workspace_size)(const Args&) = nullptr;
  const char* workspace_query = nullptr;  // the size query's Python name
  WorkspaceUse workspace = WorkspaceUse::kNone;
  bool raw_defaults = false;  // the raw op's scalars keep their defaults
  // Keyword fields (defaults: none), after every other argument of each function: the
  // weights' quantization (MK_QUANT).
  Keywords keywords = {};

  template <class... K>
  Op<Args, Fields, std::tuple<K...>> with_keywords(K... k) const {
    return {name,
            run,
            doc,
            fields,
            workspace_size,
            workspace_query,
            workspace,
            raw_defaults,
            std::make_tuple(k...)};
  }

  // The op takes a workspace of workspace_size(args) bytes; kOptional: the raw op takes it
  // as trailing keywords after the stream and the query takes no arguments.
  Op with_workspace(size_t (*size)(const Args&), const char* query,
                    WorkspaceUse use = WorkspaceUse::kRequired) const {
    Op o = *this;
    o.workspace_size = size;
    o.workspace_query = query;
    o.workspace = use;
    return o;
  }
  Op with_raw_defaults() const {
    Op o = *this;
    o.raw_defaults = true;
    return o;
  }
};

template <class Args, class Fields>
Op<Args, Fields> op(const char* name, void (*run)(const Args&, cudaStream_t), Fields fields,
                    const char* doc) {
  return {name, run, doc, fields};
}

// The op table. Field order is the Python argument order of moekit.raw.<op> (the C++
// struct's order); the torch layer (moekit/ops.py) passes its arguments in that order.
const auto kOps = std::make_tuple(
    op("fused_topk", &fused_topk,
       std::tuple_cat(fields(MK_TENSOR(gating_output), MK_TENSOR(correction_bias),
                             MK_TENSOR(topk_weights), MK_TENSOR(topk_ids)),
                      topk_param_fields()),
       "FusedTopKFwd: gating_output [T, E] bf16/f16/f32, correction_bias [E] f32 or None -> "
       "topk_weights [T, K] f32, topk_ids [T, K] i32 (written in place).")
        .with_raw_defaults(),
    op("moe_permute_align", &moe_permute_align,
       fields(MK_TENSOR(topk_ids), MK_INT(num_experts), MK_INT(block_size),
              MK_TENSOR(sorted_token_ids), MK_TENSOR(expert_ids), MK_TENSOR(num_tokens_post_padded),
              MK_TENSOR(expert_map)),
       "MoEPermuteAlignFwd: topk_ids [T, K] i32/i64 -> sorted_token_ids [T*K + E*(bs-1)] i32, "
       "expert_ids [ceil(len/bs)] i32, num_tokens_post_padded [1] i32; expert_map [E_global] "
       "i32 or None.")
        .with_workspace(&permute_align_workspace_size, "permute_align_workspace_size"),
    op("moe_pre_permute", &moe_pre_permute,
       fields(MK_TENSOR(hidden_states), MK_TENSOR(local_expert_ids), MK_INT(num_local_experts),
              MK_CONTIGUOUS_LAYOUT, MK_TENSOR(permuted), MK_TENSOR(layout_metadata),
              MK_TENSOR(inverse_indices)),
       "MoEPrePermuteFwd: hidden_states [T, H], local_expert_ids [T, K] i32/i64 -> permuted [P, H] "
       "(P = T*K + E*(alignment-1)), layout_metadata [E] i32, inverse_indices [T*K] i32.")
        .with_workspace(&pre_permute_workspace_size, "pre_permute_workspace_size"),
    op("moe_post_permute", &moe_post_permute,
       fields(MK_TENSOR(expert_output), MK_TENSOR(topk_weights), MK_TENSOR(inverse_indices),
              MK_TENSOR(out)),
       "MoEPostPermuteFwd: expert_output [P, H], topk_weights [T, K] f32, inverse_indices "
       "[T*K] i32 -> out [T, H] (expert_output's dtype or f32)."),
    op("moe_grouped_gemm", &moe_grouped_gemm,
       fields(MK_TENSOR(a), MK_TENSOR(b), MK_TENSOR(layout_metadata),
              // masked, alignment, max_m: PermutedLayout::masked(max_m) or contiguous(alignment)
              scalar<bool>("masked",
                           [](auto& g, bool v, const char*) {
                             g.layout = v ? PermutedLayout::masked(0) : PermutedLayout{};
                           }),
              scalar<int>("alignment",
                          [](auto& g, int v, const char*) {
                            if (g.layout.kind == PermutedLayout::Kind::kContiguous) {
                              g.layout.alignment = v;
                            }
                          }),
              scalar<int64_t>("max_m",
                              [](auto& g, int64_t v, const char*) {
                                if (g.layout.kind == PermutedLayout::Kind::kMasked) {
                                  g.layout.max_m = v;
                                }
                              }),
              scalar<const char*>("activation",
                                  [](auto& g, const char* s, const char* op) {
                                    g.activation = parse_activation(s, op);
                                  }),
              MK_TENSOR(c)),
       "MoEGroupedGemmFwd: contiguous a [P, Kd] -> c [P, N]; masked a [E, max_m, Kd] -> c "
       "[E, max_m, N]; b [E, N, Kd] ([E, 2N, Kd] with activation='silu_and_mul'). The "
       "workspace (grouped_gemm_workspace_size() bytes) is optional: with it the Hopper "
       "kernels balance tiles dynamically.")
        .with_workspace(&grouped_gemm_workspace_size, "grouped_gemm_workspace_size",
                        WorkspaceUse::kOptional),
    op("moe_grouped_gemm_fp8", &moe_grouped_gemm_fp8,
       fields(MK_TENSOR(a), MK_TENSOR(a_scale), MK_TENSOR(b), MK_TENSOR(b_scale),
              MK_TENSOR(layout_metadata), MK_TENSOR(c)),
       "MoEGroupedGemmFP8Fwd: masked a [E, max_m, Kd] / contiguous a [P, Kd] fp8e4m3, b "
       "[E, N, Kd] ([E, 2N, Kd] with activation='silu_and_mul') fp8e4m3, a_scale / b_scale "
       "f32 per `scales` (block: [.., Kd/128] / [E, N/128, Kd/128]; per_channel: [..] / "
       "[E, N]; per_tensor: [1] / [E]), layout_metadata [E] i32 -> c [E, max_m, N] / [P, N] "
       "bf16, or fp8e4m3 with c_scale [1] f32. Keywords: masked (default True), alignment "
       "(contiguous), scales, activation, c_scale. The workspace "
       "(grouped_gemm_fp8_workspace_size() bytes) is optional: with it the Hopper kernel "
       "balances tiles dynamically.")
        .with_workspace(&grouped_gemm_fp8_workspace_size, "grouped_gemm_fp8_workspace_size",
                        WorkspaceUse::kOptional)
        .with_keywords(
            keyword_scalar<bool>("masked",
                                 [](auto& g, bool v, const char*) {
                                   g.layout = v ? PermutedLayout::masked(0) : PermutedLayout{};
                                 },
                                 true),
            keyword_scalar<int>("alignment",
                                [](auto& g, int v, const char*) {
                                  if (g.layout.kind == PermutedLayout::Kind::kContiguous) {
                                    g.layout.alignment = v;
                                  }
                                },
                                1),
            keyword_scalar<const char*>("scales",
                                        [](auto& g, const char* s, const char* op) {
                                          g.scales = parse_fp8_scales(s, op);
                                        },
                                        "block"),
            keyword_scalar<const char*>("activation",
                                        [](auto& g, const char* s, const char* op) {
                                          g.activation = parse_activation(s, op);
                                        },
                                        "none"),
            keyword_tensor("c_scale", [](auto& g) -> TensorView& { return g.c_scale; })),
    op("moe_expert_mlp", &moe_expert_mlp,
       std::tuple_cat(
           fields(MK_TENSOR(expert_input), MK_TENSOR(layout_metadata), MK_CONTIGUOUS_LAYOUT,
                  MK_TENSOR(w_gate_up), MK_TENSOR(w_down), MK_TENSOR(expert_output)),
           activation_fields()),
       "MoEExpertMLPFwd: expert_input [P, H], layout_metadata [E] i32, w_gate_up [E, 2F, H], "
       "w_down [E, H, F] -> expert_output [P, H].")
        .with_workspace(&expert_mlp_workspace_size, "expert_mlp_workspace_size")
        .with_keywords(MK_QUANT("", a.quant)),
    op("fused_moe_experts", &fused_moe_experts, experts_fields(),
       "FusedMoEExpertsFwd: hidden_states [T, H], w_gate_up [E, 2F, H], w_down [E, H, F], "
       "topk_weights [T, K] f32, topk_ids [T, K] i32/i64 -> output [T, H]; expert_map "
       "[E_global] i32 or None, apply_router_weight_on_input.")
        .with_workspace(&fused_moe_experts_workspace_size, "fused_moe_experts_workspace_size")
        .with_keywords(MK_QUANT("", a.quant)),
    op("indexed_expert_mlp", &indexed_expert_mlp, experts_fields(),
       "IndexedExpertMLPFwd: fused_moe_experts' contract, built for T <= 64.")
        .with_workspace(&indexed_expert_mlp_workspace_size, "indexed_expert_mlp_workspace_size")
        .with_keywords(MK_QUANT("", a.quant)),
    op("fused_moe", &fused_moe,
       std::tuple_cat(fields(MK_MOE_TENSOR(hidden_states), MK_MOE_TENSOR(gating_output),
                             MK_MOE_TENSOR(correction_bias), MK_MOE_TENSOR(w_gate_up),
                             MK_MOE_TENSOR(w_down), MK_MOE_TENSOR(output)),
                      topk_param_fields(), activation_fields(), engine_fields()),
       "FusedMoEFwd: fused_topk then fused_moe_experts -> output [T, H].")
        .with_workspace(&fused_moe_workspace_size, "fused_moe_workspace_size")
        .with_keywords(MK_QUANT("", a.quant)),
    op("fused_moe_shared_expert", &fused_moe_shared_expert,
       std::tuple_cat(
           fields(MK_MOE_TENSOR(hidden_states), MK_MOE_TENSOR(gating_output),
                  MK_MOE_TENSOR(correction_bias), MK_MOE_TENSOR(w_gate_up), MK_MOE_TENSOR(w_down),
                  MK_TENSOR(shared_w_gate_up), MK_TENSOR(shared_w_down), MK_MOE_TENSOR(output)),
           topk_param_fields(), activation_fields(),
           fields(MK_TENSOR(shared_gate_up_bias), MK_TENSOR(shared_down_bias)), engine_fields()),
       "FusedMoESharedExpertFwd: fused_moe(...) + SharedMLP(x) -> output [T, H].")
        .with_workspace(&fused_moe_shared_expert_workspace_size,
                        "fused_moe_shared_expert_workspace_size")
        .with_keywords(MK_QUANT("", a.moe.quant), MK_QUANT("shared_", a.shared_quant)),
    op("shared_expert_mlp", &shared_expert_mlp,
       std::tuple_cat(fields(MK_TENSOR(hidden_states), MK_TENSOR(w_gate_up), MK_TENSOR(w_down),
                             MK_TENSOR(output)),
                      activation_fields()),
       "SharedExpertMLPFwd: hidden_states [T, H], w_gate_up [2S, H], w_down [H, S] -> "
       "output [T, H].")
        .with_workspace(&shared_expert_mlp_workspace_size, "shared_expert_mlp_workspace_size")
        .with_keywords(MK_QUANT("", a.quant)));

// ---- generation: the Python functions of one table entry ----

// Registers the Python functions of one table entry: the raw op, its workspace query and
// the torch layer's entry point _t_<op>. Each takes the fields in order, then its own
// arguments (stream, workspace), then the keyword fields (defaults: none).
template <class Args, class... F, class... K, size_t... I, size_t... J>
void register_op(nb::module_& m, const Op<Args, std::tuple<F...>, std::tuple<K...>>& entry,
                 std::index_sequence<I...>, std::index_sequence<J...>) {
  const auto* p = &entry;  // kOps lives as long as the module
  const bool defaults = entry.raw_defaults;
  const auto& fs = entry.fields;
  const auto& ks = entry.keywords;
  auto args_of = [p](Converter& cv, typename F::Py... v, typename K::Py... k) {
    Args a;
    (std::get<I>(p->fields).set(a, v, cv), ...);
    (std::get<J>(p->keywords).set(a, k, cv), ...);
    return a;
  };
  if constexpr (!HasWorkspace<Args>::value) {
    m.def(
        entry.name,
        [p, args_of](typename F::Py... v, uintptr_t stream, typename K::Py... k) {
          Converter cv(p->name);
          p->run(args_of(cv, v..., k...), as_stream(stream));
        },
        std::get<I>(fs).arg(defaults)..., arg("stream") = 0, std::get<J>(ks).arg(false)...,
        entry.doc);
    m.def(("_t_" + std::string(entry.name)).c_str(),
          [p, args_of](typename F::Py... v, uintptr_t stream, typename K::Py... k) {
            Converter cv(p->name, true);
            p->run(args_of(cv, v..., k...), as_stream(stream));
          },
          std::get<I>(fs).arg(false)..., arg("stream"), std::get<J>(ks).arg(false)...);
  } else {
    // The raw op with the caller's workspace (pointer and bytes as ints).
    auto run_raw = [p, args_of](uintptr_t workspace, size_t workspace_bytes, uintptr_t stream,
                                typename F::Py... v, typename K::Py... k) {
      Converter cv(p->name);
      Args a = args_of(cv, v..., k...);
      workspace_of(a) = as_workspace(workspace, workspace_bytes);
      p->run(a, as_stream(stream));
    };
    if (entry.workspace == WorkspaceUse::kOptional) {
      m.def(
          entry.name,
          [run_raw](typename F::Py... v, uintptr_t stream, uintptr_t workspace,
                    size_t workspace_bytes, typename K::Py... k) {
            run_raw(workspace, workspace_bytes, stream, v..., k...);
          },
          std::get<I>(fs).arg(defaults)..., arg("stream") = 0, arg("workspace") = 0,
          arg("workspace_bytes") = 0, std::get<J>(ks).arg(false)..., entry.doc);
      m.def(
          entry.workspace_query, [p] { return p->workspace_size(Args{}); },
          (std::string("Bytes of ") + entry.name + "'s optional workspace.").c_str());
    } else {
      m.def(
          entry.name,
          [run_raw](typename F::Py... v, uintptr_t workspace, size_t workspace_bytes,
                    uintptr_t stream, typename K::Py... k) {
            run_raw(workspace, workspace_bytes, stream, v..., k...);
          },
          std::get<I>(fs).arg(defaults)..., arg("workspace"), arg("workspace_bytes"),
          arg("stream") = 0, std::get<J>(ks).arg(false)..., entry.doc);
      m.def(
          entry.workspace_query,
          [p, args_of](typename F::Py... v, typename K::Py... k) {
            Converter cv(p->name);
            return p->workspace_size(args_of(cv, v..., k...));
          },
          std::get<I>(fs).arg(false)..., std::get<J>(ks).arg(false)...,
          (std::string("Bytes of ") + entry.name + "'s workspace for these arguments.").c_str());
    }
    m.def(("_t_" + std::string(entry.name)).c_str(),
          [p, args_of](typename F::Py... v, nb::handle ws, uintptr_t stream, typename K::Py... k) {
            Converter cv(p->name, true);
            Args a = args_of(cv, v..., k...);
            workspace_of(a) = workspace_from_entry(ws, p->workspace_size(a), cv.op());
            p->run(a, as_stream(stream));
          },
          std::get<I>(fs).arg(false)..., arg("ws").none(), arg("stream"),
          std::get<J>(ks).arg(false)...);
  }
}

// The arguments of moekit.raw._t_<op> before the stream: the op's fields, then "ws" where
// it takes the torch layer's workspace entry.
template <class Args, class Fields, class Keywords>
nb::tuple entry_arg_names(const Op<Args, Fields, Keywords>& entry) {
  nb::list names;
  std::apply([&](const auto&... f) { (names.append(f.name), ...); }, entry.fields);
  if constexpr (HasWorkspace<Args>::value) names.append("ws");
  return nb::tuple(names);
}

// Its keyword arguments after the stream (the torch layer passes them in this order).
template <class Args, class Fields, class Keywords>
nb::tuple entry_keyword_names(const Op<Args, Fields, Keywords>& entry) {
  nb::list names;
  std::apply([&](const auto&... k) { (names.append(k.name), ...); }, entry.keywords);
  return nb::tuple(names);
}

// Registers every op of kOps; moekit.raw.OPS: their names in table order,
// moekit.raw._ENTRY_ARGS: each op's entry_arg_names and moekit.raw._ENTRY_KEYWORDS its
// entry_keyword_names (the torch layer builds its calls of the _t_<op> entry points from
// them).
void register_ops(nb::module_& m) {
  nb::list names;
  nb::dict entry_args, entry_keywords;
  std::apply(
      [&](const auto&... entry) {
        ((register_op(m, entry,
                      std::make_index_sequence<std::tuple_size_v<decltype(entry.fields)>>{},
                      std::make_index_sequence<std::tuple_size_v<decltype(entry.keywords)>>{}),
          names.append(entry.name), entry_args[entry.name] = entry_arg_names(entry),
          entry_keywords[entry.name] = entry_keyword_names(entry)),
         ...);
      },
      kOps);
  m.attr("OPS") = nb::tuple(names);
  m.attr("_ENTRY_ARGS") = entry_args;
  m.attr("_ENTRY_KEYWORDS") = entry_keywords;
}

}  // namespace

NB_MODULE(_moekit, m) {
  m.doc() =
      "Raw binding of moekit's C++ API (no torch needed). Tensors are "
      "(data_ptr, dtype, shape[, strides]) tuples, DLPack CUDA tensors or None; "
      "streams are ints (cudaStream_t). The torch ops live in moekit.ops.";

  nb::exception<Error>(m, "MoekitError", PyExc_ValueError);

  nb::dict codes;
  codes["bf16"] = static_cast<int>(DType::kBF16);
  codes["f16"] = static_cast<int>(DType::kF16);
  codes["f32"] = static_cast<int>(DType::kF32);
  codes["i32"] = static_cast<int>(DType::kI32);
  codes["fp8e4m3"] = static_cast<int>(DType::kFP8E4M3);
  codes["i64"] = static_cast<int>(DType::kI64);
  m.attr("DTYPES") = codes;
  m.attr("__version__") = MOEKIT_VERSION_STRING;

  m.def(
      "register_dtype",
      [](nb::handle obj, int code) {
        if (code < static_cast<int>(DType::kBF16) || code > static_cast<int>(DType::kI64)) {
          throw Error("moekit.raw.register_dtype: code: expected 1..6, got " +
                      std::to_string(code));
        }
        for (int i = 0; i < g_num_registered; ++i) {
          if (g_registered[i].obj == obj.ptr()) {
            g_registered[i].code = static_cast<DType>(code);
            return;
          }
        }
        if (g_num_registered == kMaxRegistered) {
          throw Error("moekit.raw.register_dtype: at most 16 dtype objects");
        }
        g_registered[g_num_registered++] = {obj.inc_ref().ptr(), static_cast<DType>(code)};
      },
      arg("obj"), arg("code"),
      "Lets tensor tuples carry a framework's dtype object (e.g. torch.bfloat16) in place "
      "of its code; the torch layer registers torch's.");
  m.def(
      "dtype_size", [](int code) { return dtype_size(static_cast<DType>(code)); }, arg("code"),
      "Bytes per element of a dtype code (0 for an unknown code).");
  m.def(
      "dtype_name", [](int code) { return std::string(dtype_name(static_cast<DType>(code))); },
      arg("code"));
  // Tuning tables (docs/tuning.md): plain functions, no tensors.
  m.def("load_tuning_table", &load_tuning_table, arg("path"),
        "Loads a tuning table file; raises MoekitError naming the file, line and field.");
  m.def("load_tuning_table_text", &load_tuning_table_text, arg("text"), arg("name") = "<text>",
        "Loads a tuning table from its text; `name` stands for the file in errors.");
  m.def("clear_tuning_tables", &clear_tuning_tables,
        "Forgets every loaded tuning table (the built-in ones stay).");
  m.def(
      "tuning_entries",
      [] {
        nb::list out;
        for (const TuningEntry& e : tuning_entries()) {
          nb::dict d;
          d["device"] = e.device;
          d["op"] = e.shape.op;
          d["dtype"] = e.shape.dtype;
          d["quant"] = quant_scheme_name(e.shape.quant);
          d["E"] = e.shape.E;
          d["H"] = e.shape.H;
          d["F"] = e.shape.F;
          d["top_k"] = e.shape.top_k;
          d["routing"] = e.shape.routing;
          d["S"] = e.shape.S;
          d["experts"] = e.experts;
          nb::list tokens;
          for (const TokenRange& r : e.tokens) tokens.append(nb::make_tuple(r.lo, r.hi));
          d["tokens"] = tokens;
          d["plan"] = e.plan;
          d["time_us"] = e.time_us;
          d["default_us"] = e.default_us;
          d["source"] = e.source;
          out.append(d);
        }
        return out;
      },
      "Every tuning entry in lookup order (loaded tables, last loaded first, then the built-in "
      "ones), as dicts; quant: the weights' scheme ('none', 'fp8_per_channel', ...); tokens: a "
      "list "
      "of inclusive (lo, hi) ranges.");
  m.def("permuted_rows", &permuted_rows, arg("num_tokens"), arg("top_k"), arg("num_local_experts"),
        arg("alignment"),
        "Rows of a contiguous(alignment) permuted buffer: T*K + E*(alignment-1).");
  m.def("permute_align_sorted_size", &permute_align_sorted_size, arg("num_routes"),
        arg("num_experts"), arg("block_size"), "T*K + E*(block_size-1).");
  m.def("permute_align_num_blocks", &permute_align_num_blocks, arg("num_routes"),
        arg("num_experts"), arg("block_size"), "ceil(sorted_size / block_size).");
  m.def(
      "describe",
      [](nb::handle t) {
        Converter cv("describe");
        return cv(t, "t").describe();
      },
      arg("t").none(), "How moekit sees a tensor argument, e.g. 'bf16[512, 4096]'.");
  m.def(
      "device_count",
      []() {
        int n = 0;
        if (cudaGetDeviceCount(&n) != cudaSuccess) {
          cudaGetLastError();
          return 0;
        }
        return n;
      },
      "CUDA devices visible to moekit's runtime (0 without a driver or GPU).");

  register_ops(m);

  // ---- the torch layer's entry points (moekit.ops) ----
  // Same arguments as the ops above, but tensors are torch.Tensors read in C++
  // (Converter's torch mode, all on one CUDA device) and the workspace is the torch
  // layer's cached entry, grown through its callback: one call, one conversion.
  m.def(
      "_register_torch",
      [](nb::handle tensor_type, nb::handle grow, bool use_exchange) {
        if (!PyType_Check(tensor_type.ptr())) {
          throw Error("moekit.raw._register_torch: tensor_type: expected a type");
        }
        Py_XDECREF(reinterpret_cast<PyObject*>(g_tensor_type));
        Py_XDECREF(g_workspace_grow);
        g_tensor_type = reinterpret_cast<PyTypeObject*>(tensor_type.inc_ref().ptr());
        g_workspace_grow = grow.inc_ref().ptr();
        // The descriptors are those torch.Tensor resolves the names to (borrowed from
        // the type's MRO, which the strong reference to the type keeps alive).
        PyTypeObject* t = g_tensor_type;
        bool usable = true;
        for (const TensorAttr& a : kTensorAttrs) {
          g_names.*a.member = PyUnicode_InternFromString(a.name);
          PyObject* d = _PyType_Lookup(t, g_names.*a.member);
          g_descrs.*a.member = d;
          usable = usable && d && PyObject_TypeCheck(d, a.descr_type);
        }
        if (!usable) g_descrs = TensorAttrs{};  // a torch whose attributes are not C descriptors
        // torch >= 2.9: the DLPack C exchange API (major version 1, with the DLTensor
        // export); older torch reads attributes only.
        g_names.exchange_api = PyUnicode_InternFromString("__dlpack_c_exchange_api__");
        g_exchange = nullptr;
        g_exchange_capsule = nullptr;
        PyObject* cap = _PyType_Lookup(t, g_names.exchange_api);
        if (usable && use_exchange && cap && PyCapsule_IsValid(cap, "dlpack_exchange_api")) {
          auto* api =
              static_cast<const xdl::Api*>(PyCapsule_GetPointer(cap, "dlpack_exchange_api"));
          if (api && api->header.major == 1 && api->dltensor_from_py_object_no_sync) {
            g_exchange = api;
            g_exchange_capsule = cap;
          }
        }
        PyErr_Clear();
        for (int i = 0; i < g_num_fast_types; ++i) {
          Py_DECREF(reinterpret_cast<PyObject*>(g_fast_types[i]));
        }
        g_num_fast_types = 0;
      },
      arg("tensor_type"), arg("grow"), arg("use_exchange") = true);
  m.def(
      "_t_view",
      [](nb::handle t) {
        Converter cv("_t_view", true);
        TensorView v = cv(t, "t");
        nb::list shape;
        for (int d = 0; d < v.ndim; ++d) shape.append(v.shape[d]);
        return nb::make_tuple(reinterpret_cast<uintptr_t>(v.data), static_cast<int>(v.dtype),
                              nb::tuple(shape));
      },
      arg("t"), "Tests: (data_ptr, dtype code, shape) as the torch entry points read t.");
  m.def(
      "_tensor_protocol", []() { return g_exchange ? "dlpack-exchange" : "attributes"; },
      "How the torch entry points read tensors: 'dlpack-exchange' (torch's DLPack C "
      "exchange API, one C call per tensor) or 'attributes'.");
  m.def(
      "_launch_ctx",
      [](nb::handle t) -> nb::object {
        // Where the torch layer launches an op whose first tensor is t: (device index,
        // torch's current stream of that device as an int) when t is a CUDA tensor on
        // the current device, else None (the caller then checks the devices, naming
        // the argument at fault, and calls again under t's device). One C call instead
        // of t.get_device(), torch's current device and its current stream (three
        // Python calls, ~0.6 us on the H200 host): the device from the exchange API's
        // DLTensor, the current device from this extension's CUDA runtime (the device
        // its launches go to: the context current on this thread, which torch's
        // runtime sets), the stream from the exchange API (torch.cuda.current_stream).
        // Anything else (no exchange API, a tensor subclass, managed memory, an error,
        // the two runtimes disagreeing) is answered by the torch layer's Python
        // version, registered with _register_torch.
        PyObject* o = t.ptr();
        if (g_exchange != nullptr && g_exchange->current_work_stream != nullptr &&
            Py_TYPE(o) == g_tensor_type) {
          xdl::Tensor dl{};
          if (g_exchange->dltensor_from_py_object_no_sync(o, &dl) != 0) {
            PyErr_Clear();
          } else if (dl.device.device_type == kDLCUDA) {
            int cur = -1;
            if (cudaGetDevice(&cur) != cudaSuccess) {
              cudaGetLastError();
            } else if (cur == dl.device.device_id) {
              void* stream = nullptr;
              if (g_exchange->current_work_stream(kDLCUDA, cur, &stream) == 0) {
                return nb::make_tuple(cur, reinterpret_cast<uintptr_t>(stream));
              }
              PyErr_Clear();
            }
          } else if (dl.device.device_type != kDLCUDAManaged) {
            return nb::none();  // a CPU or meta tensor: never launched from here
          }
        }
        if (g_launch_ctx_fallback == nullptr) {
          throw Error("moekit.raw._launch_ctx: no fallback registered (moekit.ops does it)");
        }
        PyObject* r = PyObject_CallOneArg(g_launch_ctx_fallback, o);
        if (!r) throw nb::python_error();
        return nb::steal(r);
      },
      arg("t"),
      "The torch layer's launch context for a first tensor t: (device, current stream) or "
      "None when t is not a CUDA tensor on the current device.");
  m.def(
      "_set_launch_ctx_fallback",
      [](nb::handle fn) {
        Py_XDECREF(g_launch_ctx_fallback);
        g_launch_ctx_fallback = fn.inc_ref().ptr();
      },
      arg("fn"), "The torch layer's Python launch context (see _launch_ctx).");
  m.def(
      "_stream_capturing",
      [](uintptr_t stream) {
        // torch._C._cuda_isCurrentStreamCapturing's answer for the current stream, which
        // the torch layer already holds: one CUDA call, without torch's lookups of the
        // current device, its primary context and its current stream (~0.07 us on the
        // development VM). Any status but "none" counts as
        // capturing, as in torch; so does an error on a device that exists (e.g. the
        // legacy stream during another stream's global-mode capture): the caller then
        // allocates its workspace per call, which is always safe. Without a usable
        // device nothing can be capturing.
        cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
        cudaError_t err = cudaStreamIsCapturing(as_stream(stream), &status);
        if (err != cudaSuccess) {
          cudaGetLastError();
          return !(err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver ||
                   err == cudaErrorInitializationError || err == cudaErrorStubLibrary);
        }
        return status != cudaStreamCaptureStatusNone;
      },
      arg("stream"),
      "Whether the CUDA stream (an int) is capturing a graph (the torch layer's check "
      "before it uses a cached workspace).");
  m.def(
      "_set_device_check",
      [](bool on) {
        bool old = g_check_devices;
        g_check_devices = on;
        return old;
      },
      arg("on"), "Tests only: off lets CPU tensors through the torch entry points.");
}
