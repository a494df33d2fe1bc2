// The bridge from the linear ops to omni_quant.runtime.batch_rows (batch_rows.h): the engine step's request
// boundaries, read through the Python C API.
#include <Python.h>

#include <string>

#include "batch_rows.h"

namespace omni_w4a8 {
namespace {

// The pending Python error as "Type: message", cleared (GIL held).
std::string take_python_error() {
  PyObject *type = nullptr, *value = nullptr, *tb = nullptr;
  PyErr_Fetch(&type, &value, &tb);
  PyErr_NormalizeException(&type, &value, &tb);
  std::string out = type ? reinterpret_cast<PyTypeObject*>(type)->tp_name : "unknown error";
  PyObject* text = value ? PyObject_Str(value) : nullptr;
  const char* c = text ? PyUnicode_AsUTF8(text) : nullptr;
  if (c && *c) out += std::string(": ") + c;
  Py_XDECREF(text);
  Py_XDECREF(type);
  Py_XDECREF(value);
  Py_XDECREF(tb);
  PyErr_Clear();
  return out;
}

// Reading the bounds failed: omni_quant.runtime.batch_rows.report_failure logs it once per process (Python
// logging, "vllm.omni_quant.runtime.batch_rows"); if that module is what fails, the logging module directly,
// once. GIL held.
void report_bounds_failure(const std::string& reason) {
  PyObject* mod = PyImport_ImportModule("omni_quant.runtime.batch_rows");
  PyObject* res = mod ? PyObject_CallMethod(mod, "report_failure", "s", reason.c_str()) : nullptr;
  if (!res) {
    const std::string why = reason + "; then " + take_python_error();
    static bool warned = false;
    if (!warned) {
      warned = true;
      PyObject* logging = PyImport_ImportModule("logging");
      PyObject* logger = logging ? PyObject_CallMethod(logging, "getLogger", "s", "vllm.omni_quant.runtime.batch_rows") : nullptr;
      PyObject* done = logger ? PyObject_CallMethod(logger, "warning", "ss",
                                                    "omni-quant: the rows of the engine step's sequences could not be "
                                                    "read (%s); the W4A8 kernel treats each call's rows as one "
                                                    "sequence from now on (logged once)",
                                                    why.c_str())
                              : nullptr;
      if (!done) PyErr_Clear();
      Py_XDECREF(done);
      Py_XDECREF(logger);
      Py_XDECREF(logging);
    }
  }
  Py_XDECREF(res);
  Py_XDECREF(mod);
}

// Row boundaries of the requests among a call's m rows, {0, s1, ..., m}: from
// omni_quant.runtime.batch_rows.sequence_bounds (vLLM's query_start_loc of the running step). On a Python
// error or a malformed answer, {0, m} (the call's rows as one request) and the reason logged once
// (report_bounds_failure): a request's numbers may then depend on its batch (C09).
}  // namespace

std::vector<int64_t> sequence_bounds(int64_t m) {
  std::vector<int64_t> bounds;
  std::string failure;
  PyGILState_STATE gil = PyGILState_Ensure();
  PyObject* mod = PyImport_ImportModule("omni_quant.runtime.batch_rows");
  PyObject* res = mod ? PyObject_CallMethod(mod, "sequence_bounds", "L", static_cast<long long>(m)) : nullptr;
  if (res && !PyTuple_Check(res)) {
    failure = std::string("omni_quant.runtime.batch_rows.sequence_bounds returned a ") + Py_TYPE(res)->tp_name +
              ", not a tuple";
  } else if (res) {
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(res); ++i) {
      const long long v = PyLong_AsLongLong(PyTuple_GET_ITEM(res, i));
      if (v == -1 && PyErr_Occurred()) break;
      bounds.push_back(v);
    }
  }
  if (PyErr_Occurred()) {
    failure = "omni_quant.runtime.batch_rows.sequence_bounds: " + take_python_error();
  } else if (failure.empty() && (bounds.size() < 2 || bounds.front() != 0 || bounds.back() != m)) {
    failure = "omni_quant.runtime.batch_rows.sequence_bounds(" + std::to_string(m) + ") returned " +
              std::to_string(bounds.size()) + " bounds, not 0, ..., " + std::to_string(m);
  }
  if (!failure.empty()) {
    bounds = {0, m};
    report_bounds_failure(failure);
  }
  Py_XDECREF(res);
  Py_XDECREF(mod);
  PyGILState_Release(gil);
  return bounds;
}

}  // namespace omni_w4a8
