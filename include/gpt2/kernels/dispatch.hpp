// The kernel layer's public face: which instruction-set level runs (kernels/isa.hpp: Isa,
// active_isa, set_isa, kernel_info), the table of kernels each level has (kernels/table.hpp), and
// the tables themselves (kernels/levels.hpp). docs/kernels.md describes the levels and how one is
// chosen, forced and reported.
#pragma once

#include "gpt2/kernels/isa.hpp"
#include "gpt2/kernels/levels.hpp"
#include "gpt2/kernels/table.hpp"
