/* Neural-network layers on the CPU, f32: softmax, layer normalisation, attention.
 * Plain functions over flat arrays. Declared from their rows of runtime/kernels/kernels.def
 * (kernels.h), their comments (with the shapes) there. */
#ifndef TOKPIPE_CPU_NN_H
#define TOKPIPE_CPU_NN_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#include "../../base/host_device.h"
#include "../kernels/args.h"
#include "kernels.h"

#endif
