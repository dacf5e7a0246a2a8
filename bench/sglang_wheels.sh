#!/usr/bin/env bash
# Prepares SGLang 0.5.17 (the newest release whose pins fit the lent H200's torch 2.11.0+cu130,
# Python 3.12) as wheels for that offline machine, split into git-ignored carry folders .sgl-1,
# .sgl-2, ... in the project root (55M parts, one a folder, under the 64 MiB a device call carries).
# Run from the repo; it prints the device calls. Extra NAME==VERSION arguments add more wheels.
# It installs to $HOME/sgl-site, which goes first on PYTHONPATH for SGLang runs only, before the
# vLLM set in $HOME/site (carried separately: vLLM 0.26.0, pydantic, ...), which SGLang needs too.
# Carried: SGLang's own pins where the machine or the vLLM set has another version (transformers
# 5.12.1: the machine's 5.17 clashes on 'qwen3_asr'; tokenizers, tvm-ffi, flashinfer, openai,
# openai-harmony) and what `import sglang`, its Engine and HTTP server import beyond those sets.
# Left out, and why:
#  - what the machine has (torch, triton, torchvision, torchaudio, nvidia-*, numpy, scipy, numba,
#    timm, pillow, ... incl. ninja and nvcc 13.0) and what the vLLM set has (pydantic, fastapi,
#    pyzmq, msgspec, llguidance, xgrammar 0.2.8 for SGLang's 0.2.1: only grammar-constrained
#    requests use it; rlkit starts SGLang with skip_tokenizer_init, which builds no grammar backend);
#  - sglang-kernel's FA3 library flash_ops*.so (342 MB; only attention_backend=fa3 loads it: use
#    triton) and its sm100 (Blackwell) kernels; the sm90 (Hopper) ones stay;
#  - sgl-deep-gemm (imported under try/except; without it SGLang never JIT-compiles DeepGEMM
#    with nvcc), CuTe DSL / FA4 / quack / tilelang / helion / humming / tokenspeed kernels
#    (DeepSeek, Kimi, Blackwell, quantized paths only), the pip nvcc (nvcc + nvvm is ~100 MB),
#    outlines, modelscope, datasets, torchao, torchcodec, grpc, anthropic: imported lazily by
#    features rlkit does not use.
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
pkgs=(sglang==0.5.17 sglang-kernel==0.4.5 transformers==5.12.1 tokenizers==0.22.2
      apache-tvm-ffi==0.1.11 flashinfer-python==0.6.15.post1 openai==2.6.1 openai-harmony==0.0.4
      torch-memory-saver==0.0.10 compressed-tensors==0.20.1 loguru==0.7.3 gguf==0.19.0
      orjson==3.13.0 distro==1.9.0 python-multipart==0.0.34 uvicorn==0.54.0 watchfiles==1.3.0
      zstandard==0.25.0 opentelemetry-api==1.45.2 soundfile==0.13.1 cffi==2.1.1 pycparser==3.12
      ninja==1.13.2 py-spy==0.4.3
      # IPython (sglang.utils imports it) and what it needs beyond the machine's packages
      ipython==9.18.1 asttokens==3.0.2 executing==2.3.0 ipython-pygments-lexers==1.1.1
      jedi==0.20.1 matplotlib-inline==0.2.2 parso==0.8.7 pexpect==4.9.0 prompt-toolkit==3.0.53
      ptyprocess==0.7.0 pure-eval==0.2.4 stack-data==0.6.3 traitlets==5.16.1 wcwidth==0.9.4)
pkgs+=("$@")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
rm -rf .sgl-*
# manylinux_2_34: sglang 0.5.17's own wheel (it installed on the machine in session 5)
pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_24_x86_64 \
  --platform manylinux_2_27_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_31_x86_64 \
  --platform manylinux_2_34_x86_64 -d "$work/dl" "${pkgs[@]}" 2> >(grep -v '^WARNING: Location' >&2)
# Strip the kernel wheel: drop the files, drop their RECORD lines (the others keep their hashes).
python3 - "$work"/dl/sglang_kernel-0.4.5-*.whl <<'EOF'
import os, re, sys, zipfile
src = sys.argv[1]
drop = re.compile(r"sgl_kernel/(flash_ops[^/]*\.so|sm100/.*)")
before = os.path.getsize(src)
with zipfile.ZipFile(src) as zi, zipfile.ZipFile(src + ".new", "w", zipfile.ZIP_DEFLATED) as zo:
    for info in zi.infolist():
        if drop.fullmatch(info.filename):
            continue
        data = zi.read(info)
        if info.filename.endswith(".dist-info/RECORD"):
            lines = [l for l in data.decode().splitlines() if not drop.fullmatch(l.split(",")[0])]
            data = ("\n".join(lines) + "\n").encode()
        zo.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED)
os.replace(src + ".new", src)
print(f"sglang-kernel: {before / 1e6:.0f} MB -> {os.path.getsize(src) / 1e6:.0f} MB", file=sys.stderr)
EOF
echo "wheels: $(ls "$work/dl" | wc -l), $(du -sm "$work/dl" | cut -f1) MB"
tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -cf "$work/sgl-wheels.tar" -C "$work/dl" .
(cd "$work" && split -b 55M -d sgl-wheels.tar sgl-part-)
n=0
for p in "$work"/sgl-part-*; do n=$((n+1)); mkdir -p ".sgl-$n"; mv "$p" ".sgl-$n/"; done
echo "Made $n carry folders (.sgl-1 .. .sgl-$n). Device calls, back to back (the machine leaves after ~30 s idle):"
for i in $(seq 1 $((n-1))); do
  echo "  call $i  carry [\".sgl-$i\"]  command: mkdir -p \$HOME/sglstash && cp .sgl-$i/* \$HOME/sglstash/"
done
echo "  call $n  carry [\".sgl-$n\"]  command:"
echo "    mkdir -p \$HOME/sglstash && cp .sgl-$n/* \$HOME/sglstash/ && S=\$HOME/sglstash && cat \$S/sgl-part-* | tar -x -C \$S && rm \$S/sgl-part-* && python3 -m pip install -q --no-index --no-deps --no-compile --target \$HOME/sgl-site \$S/*.whl"
echo "  then, for SGLang runs (the vLLM set in \$HOME/site too):"
echo "    export PYTHONPATH=\$HOME/sgl-site:\$HOME/site:\$PWD PATH=\$HOME/sgl-site/bin:\$PATH && YOUR_COMMAND"
