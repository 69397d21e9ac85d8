/* kvsim.simcore._core: the compiled engine core as a Python extension module.
 *
 * The module itself exports nothing to Python: simcore/ccore.py finds this file through the import
 * system and calls the plain C functions of engine.c and pricing.c with ctypes. Building it as an
 * extension is what makes `pip install .` compile the core (once, at install time, into the
 * package) instead of kvsim compiling it at run time into a cache folder. Limited API: one build
 * serves every CPython >= 3.11. */
#define Py_LIMITED_API 0x030B0000
#include <Python.h>

static struct PyModuleDef core_module = {
    PyModuleDef_HEAD_INIT, "_core",
    "kvsim's compiled engine core (C functions called through ctypes by kvsim.simcore.ccore).", -1, NULL,
};

PyMODINIT_FUNC PyInit__core(void) { return PyModule_Create(&core_module); }
