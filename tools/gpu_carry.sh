#!/usr/bin/env bash
# Build .devcarry/ (git-ignored) for tools/gpu_run.sh on a lent H200, from this machine:
# the wheels the GPU image lacks (CPython 3.12, manylinux), the polars runtime as tar.xz (its wheel,
# 54 MB, is over the 64 MiB carry limit with the repo; xz brings it to 31 MB), this machine's
# stdlib corpus cache (run any stdlib trial first so it exists) and the prepared English corpus.
#
#   tools/gpu_carry.sh [ENGLISH_DIR]    # default data/shakespeare_bytes (specs/english/english.yaml's header prepares it)
#
# Then: run(command="bash tools/gpu_run.sh", carry=[".devcarry"], timeout_s=600).
set -euo pipefail
cd "$(dirname "$0")/.."
C=.devcarry; ENGLISH=${1:-data/shakespeare_bytes}
grep -qx '/.devcarry/' .git/info/exclude 2>/dev/null || echo /.devcarry/ >> .git/info/exclude
rm -rf $C && mkdir -p $C
ver() { python3 -c "import importlib.metadata as m; print(m.version('$1'))"; }
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d $C \
  polars==$(ver polars) polars-runtime-32==$(ver polars-runtime-32) pydantic==$(ver pydantic) \
  pydantic_core==$(ver pydantic_core) annotated-types==$(ver annotated-types) \
  typing-inspection==$(ver typing-inspection) typing_extensions==$(ver typing_extensions)
tmp=$(mktemp -d) && (cd $tmp && unzip -q "$OLDPWD"/$C/polars_runtime_32-*.whl) && tar cf - -C $tmp . | xz -T0 -9 > $C/prt.tar.xz
rm -rf $tmp $C/polars_runtime_32-*.whl
cache=$(python3 -c "
import json, pathlib, study.data as d
root = d.cache_dir(); fp = d.load_corpus(d.DataConfig()).fingerprint
print(next(str(p) for p in sorted(root.glob('stdlib-*')) if json.loads((p / 'meta.json').read_text())['fingerprint'] == fp))")
xz -T0 -6 -c $cache/train.npy > $C/train.npy.xz && xz -T0 -6 -c $cache/val.npy > $C/val.npy.xz && cp $cache/meta.json $C/
tar cf - "$ENGLISH" | xz -T0 -6 > $C/shakespeare.tar.xz
du -sh $C; ls -la $C
