// The extension's two faces: the torch ops omni_quant::w4a8_linear, dequantize, w4a8_linear_sb, dequantize_sb
// (linear_ops.h, linear_sb.h; the fused layers register theirs in fused_layer_ops.cpp), and the Python module
// omni_quant.kernels._w4a8 (which kernels this CPU runs, the linear ops' clock).
#include <Python.h>

#include <torch/library.h>

#include "isa.h"
#include "linear_clock.h"
#include "linear_ops.h"
#include "linear_sb.h"

TORCH_LIBRARY(omni_quant, m) {
  m.def("w4a8_linear(Tensor x, Tensor w, Tensor sz, int group_size, Tensor? bias=None, str isa='auto', "
        "Tensor? dequant_rows=None) -> Tensor");
  m.def("dequantize(Tensor w, Tensor sz, int group_size, str isa='auto') -> Tensor");
  m.def("w4a8_linear_sb(Tensor x, Tensor w, Tensor sb, Tensor? bias=None, str isa='auto', "
        "Tensor? dequant_rows=None) -> Tensor");
  m.def("dequantize_sb(Tensor w, Tensor sb, str isa='auto') -> Tensor");
}

TORCH_LIBRARY_IMPL(omni_quant, CPU, m) {
  m.impl("w4a8_linear", &omni_w4a8::w4a8_linear);
  m.impl("dequantize", &omni_w4a8::dequantize);
  m.impl("w4a8_linear_sb", &omni_w4a8::w4a8_linear_sb);
  m.impl("dequantize_sb", &omni_w4a8::dequantize_sb);
}

// ---- Python module: which kernels this CPU can run -------------------------------------------

static PyObject* py_supported_isas(PyObject*, PyObject*) {
  PyObject* out = PyList_New(0);
  for (const char* isa : {"avx512vnni", "avx2vnni", "avx2", "scalar"})
    if (omni_w4a8::supported(isa)) PyList_Append(out, PyUnicode_FromString(isa));
  return out;
}

static PyObject* py_best_isa(PyObject*, PyObject*) { return PyUnicode_FromString(omni_w4a8::best_isa().c_str()); }

static PyObject* py_linear_clock(PyObject*, PyObject*) {
  return Py_BuildValue("(LL)", static_cast<long long>(omni_w4a8::g_linear_ns.load()),
                       static_cast<long long>(omni_w4a8::g_linear_calls.load()));
}

static PyMethodDef kMethods[] = {
    {"linear_clock", py_linear_clock, METH_NOARGS, "(ns, calls) inside w4a8_linear and w4a8_linear_sb since load."},
    {"supported_isas", py_supported_isas, METH_NOARGS, "Kernels this CPU can run, fastest first."},
    {"best_isa", py_best_isa, METH_NOARGS, "The kernel 'auto' picks on this CPU."},
    {nullptr, nullptr, 0, nullptr}};

static PyModuleDef kModule = {PyModuleDef_HEAD_INIT, "_w4a8",
                              "omni-quant's W4A8 CPU kernel (registers torch.ops.omni_quant.w4a8_linear).", -1,
                              kMethods};

PyMODINIT_FUNC PyInit__w4a8(void) { return PyModule_Create(&kModule); }
