#!/bin/sh
# ptx_no_fma.sh NVCC SRC_DIR WORK_DIR: runtime/cuda/optim.cu compiled by nvcc to PTX (sm_90,
# as for an H100 or H200); the AdamW kernels must hold no fused multiply-add (fma.*.f32),
# which would round differently from the CPU's AdamW (kernels/element.h's TP_FMUL_RN), and
# must hold the explicitly rounded products (mul.rn.f32) that say the kernel was found.
nvcc=$1 src=$2 work=$3
mkdir -p "$work" && cd "$work" || exit 1
"$nvcc" -std=c++17 -arch=sm_90 -ptx -I"$src/runtime" "$src/runtime/cuda/optim.cu" -o optim.ptx ||
  { echo "FAIL nvcc -ptx $src/runtime/cuda/optim.cu"; exit 1; }
# the bodies of the entries whose name says adamw
awk '/^\.(visible )?\.entry .*adamw/ { p = 1 } p { print } p && /^}/ { p = 0 }' optim.ptx >adamw.ptx
fma=$(grep -c 'fma\.[a-z.]*f32' adamw.ptx) mul=$(grep -c 'mul\.rn\.f32' adamw.ptx)
if [ "$fma" -ne 0 ]; then
  echo "FAIL the AdamW kernels hold $fma fused multiply-adds:"; grep -n 'fma\.[a-z.]*f32' adamw.ptx | head -5; exit 1
fi
if [ "$mul" -eq 0 ]; then
  echo "FAIL no AdamW kernel with mul.rn.f32 in optim.ptx"; exit 1
fi
echo "ok: the AdamW kernels hold no fma ($mul mul.rn.f32)"
