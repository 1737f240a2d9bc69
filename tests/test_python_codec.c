/* The delta codec on PyTorch AdamW checkpoint pairs (tests/python/codec_*.py),
 * run by the same driver as test_python, in a binary of its own: training
 * the 14.6 M-parameter pairs is the slowest of the Python tests. */
#define PY_GLOB "tests/python/codec_*.py"
#include "test_python.c"
