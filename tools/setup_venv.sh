#!/usr/bin/env bash
# The README's set-up, and CI's: a virtual environment with the CPU build of
# torch 2.13.0 and this package (editable, with its test dependencies; pip
# builds the native shim with the system C++ compiler).
#
#   tools/setup_venv.sh [VENV [--npu] [PIP-OPTION...]]      VENV defaults to .venv
#
# --npu: also torch_npu==2.13.0 (the NPU environment, .venv-npu), resolved in
# the same pip run as the CPU torch, so torch_npu's `torch==2.13.0` is met by
# the CPU build and pip never takes PyPI's CUDA build for it. Without CANN,
# `npu-lifetime ... --device npu` there runs over the stand-in CANN runtime
# (tests/platforms/npu_standin) and says so.
#
# PyPI's torch for Linux is the CUDA build (torch 527 MB plus triton, 15
# nvidia-* and 3 cuda-* packages: 2.74 GB to download). The CPU build
# (192 MB) is on PyTorch's CPU wheel index, which this script asks once, with
# a 5 s limit:
#   - it answers: pip searches it beside its own index(es);
#   - it does not (no route, no DNS, blocked): pip is not pointed at it, so it
#     does not retry it for every package (before: 50 warnings, about 95 s);
#     the CPU build can still come from pip's own configuration (a mirror, a
#     local wheel store: CI's machines have one).
# torch is pinned to the CPU build (torch==2.13.0+cpu on Linux): where no
# source has it, pip stops at once, nothing is downloaded, and this script
# says how to go on; it never falls back to the CUDA build by itself.
#
# NPL_TORCH_INDEX: another CPU wheel index (a mirror); NPL_TORCH: another
# torch requirement (NPL_TORCH=torch==2.13.0 takes PyPI's CUDA build).
# PIP-OPTIONs go to both pip installs (CI passes --quiet).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-.venv}
shift || true
npu=()
pip_options=()
for arg in "$@"; do
    if [ "$arg" = --npu ]; then
        npu=("${NPL_TORCH_NPU:-torch_npu==2.13.0}")
    else
        pip_options+=("$arg")
    fi
done
set -- ${pip_options[@]+"${pip_options[@]}"}
index=${NPL_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}
if [ "$(uname -s)" = Linux ]; then
    torch=${NPL_TORCH:-torch==2.13.0+cpu}
else
    torch=${NPL_TORCH:-torch==2.13.0}  # macOS: PyPI's torch is the CPU build
fi

python3 -m venv "$venv"
extra=()
if "$venv/bin/python" - "$index" <<'EOF'
import sys
import urllib.error
import urllib.request

index = sys.argv[1].rstrip("/")
try:
    urllib.request.urlopen(urllib.request.Request(index + "/torch/", method="HEAD"), timeout=5).close()
except urllib.error.HTTPError:
    pass  # it answered
except Exception as err:
    reason = getattr(err, "reason", err)
    print(f"setup: {index} cannot be reached from here ({reason}): pip will look for torch's CPU build only in "
          "its own index(es) and wheel stores", file=sys.stderr)
    sys.exit(1)
EOF
then
    extra=(--extra-index-url "$index")
fi

if ! "$venv/bin/pip" install "$torch" ${npu[@]+"${npu[@]}"} ${extra[@]+"${extra[@]}"} "$@"; then
    if [ ${#extra[@]} -gt 0 ]; then
        echo "setup: pip could not install $torch (its message is above)" >&2
    else
        cat >&2 <<EOF
setup: pip found no $torch (torch's CPU build). It is on
    $index
which did not answer from here, and pip's own indexes and wheel stores lack it.
Make that index reachable, or set NPL_TORCH_INDEX to a mirror of it, or take
PyPI's CUDA build (about 2.7 GB to download with its nvidia-* packages):
    NPL_TORCH=torch==2.13.0 tools/setup_venv.sh $venv
EOF
    fi
    exit 1
fi
"$venv/bin/pip" install -e '.[test]' "$@"
# NPU_LIFETIME_SANITIZER's start-up hook: a wheel install puts it in site-packages (setup.py), an editable
# install does not, so it is put there here (a real venv only: one has pyvenv.cfg)
if [ -f "$venv/pyvenv.cfg" ]; then
    packages=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    cp npu_lifetime/startup_hook.pth "$packages/npu_lifetime_sanitizer.pth"
fi
