// Compiled once per ISA variant (with that ISA's flags): the weight-only INT8 / INT4 linear
// kernels (quant_impl.h) instantiated in namespace octavo::OCTAVO_ISA_NS.
#include "vec.h"
#include "quant_impl.h"
