// Compiled once per ISA variant (with that ISA's flags): the kernel source instantiated in
// namespace octavo::OCTAVO_ISA_NS.
#include "vec.h"
#include "kernels_impl.h"
