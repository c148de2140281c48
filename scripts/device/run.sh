#!/usr/bin/env bash
# The prepared GPU run (docs/gpu.md): stage the last pack part, reassemble and install offline, print versions,
# run the gpu tests, the engine bench and the demo replay on CUDA, and leave every result under $OUT.
#
#   bash scripts/device/run.sh                    # everything (the device call after the staging calls)
#   STEPS="install tests" TESTS_K=bf16 bash scripts/device/run.sh   (steps: install versions tests replay step
#                                                                   replay-dynamic bench samples power probe
#                                                                   vllm-install vllm-smoke vllm-replay;
#                                                                   default: install versions tests bench replay)
#
# Each step has its own time limit (a hang costs that step, not the session's device time), and a failed step
# does not stop the next: what each printed is in $OUT/<step>.log, its exit status in $OUT/steps.txt.
set -u
export OUT=${OUT:-$PWD/gpu-out}
export PY=${PY:-python3}
export PACK=${TOOLAUDIT_PACK:-/tmp/toolaudit-pack} TOOLAUDIT_PACK=${TOOLAUDIT_PACK:-/tmp/toolaudit-pack}
export PACK_SRC=${PACK_SRC:-.gpu-pack}
STEPS=${STEPS:-"install versions tests bench replay"}
export TOOLAUDIT_CACHE=${TOOLAUDIT_CACHE:-/tmp/toolaudit-cache}  # the converted model, outside the checkout
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
mkdir -p "$OUT"
: > "$OUT/steps.txt"

step() {  # step NAME SECONDS COMMAND...: run with a limit, log to $OUT/NAME.log, record the status (a COMMAND
          # that is a function of this script runs in a child bash: `timeout` runs programs, not functions)
    local name=$1 limit=$2; shift 2
    case " $STEPS " in *" $name "*) ;; *) return 0 ;; esac
    local start=$SECONDS
    echo "=== $name (limit ${limit}s)"
    if [ "$(type -t "$1")" = function ]; then
        export -f "$1"
        set -- bash -c "$1"
    fi
    timeout --signal=TERM --kill-after=10 "$limit" "$@" > "$OUT/$name.log" 2>&1
    local rc=$?
    tail -n "${TAIL:-40}" "$OUT/$name.log"
    echo "$name rc=$rc seconds=$((SECONDS - start))" | tee -a "$OUT/steps.txt"
}

install_pack() {  # the base bundle (make gpu-pack): the part this call carries, if any, then every part staged
    install_bundle || return 1
    "$PY" -c "import toolaudit, duckdb, jsonschema, deepdiff, openai, gguf, orjson; print('imports ok')"
}

install_vllm() {  # the vLLM bundle (make gpu-pack-vllm), staged under $PACK_VLLM by the calls before
    PACK=$PACK_VLLM PACK_SRC=${PACK_VLLM_SRC:-.gpu-pack-vllm} install_bundle || return 1
    "$PY" -c "import vllm; print('vllm', vllm.__version__)"
}

install_bundle() {  # reassemble $PACK's parts (checked against the manifest's sha256) and install them offline
    if [ -d "$PACK_SRC" ]; then TOOLAUDIT_PACK=$PACK bash scripts/device/stage.sh "$PACK_SRC" >/dev/null || return 1; fi
    "$PY" - "$PACK" <<'PYEOF' || return 1
import hashlib, json, sys, tarfile, io
from pathlib import Path
pack = Path(sys.argv[1])
manifest = json.loads((pack / "manifest.json").read_text())
names = [Path(p["file"]).name for p in manifest["parts"]]
missing = [n for n in names if not (pack / n).is_file()]
if missing:
    sys.exit(f"missing parts {missing}: stage each part first (scripts/device/stage.sh, docs/gpu.md)")
data = b"".join((pack / n).read_bytes() for n in names)
if hashlib.sha256(data).hexdigest() != manifest["bundle_sha256"]:
    sys.exit("the reassembled bundle's sha256 differs from the manifest's: a part is stale or truncated")
tarfile.open(fileobj=io.BytesIO(data)).extractall(pack / "bundle", filter="data")
print(f"bundle ok: {len(data) / 2**20:.1f} MiB, {len(manifest['wheels'])} wheels")
PYEOF
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir "$PACK"/bundle/wheels/*.whl || return 1
    "$PY" -m pip check | grep -v "^No broken" || true
}

vllm_smoke() {  # one LLM with ngram speculation on CUDA in bf16, two demo prompts: does 0.26 load and decode here
    "$PY" - <<'PYEOF'
from toolaudit.engines import make_engine
from toolaudit.engines.paths import load_paths
from toolaudit.replay.demo import DEMO_TRACES
import json
from toolaudit.engines.base import EngineRequest
rows = [json.loads(l) for l in DEMO_TRACES.read_text().splitlines()[:2]]
reqs = [EngineRequest(key=f"s{i}", messages=r["request"]["messages"], tools=r["request"].get("tools", []))
        for i, r in enumerate(rows)]
engine = make_engine(load_paths("scripts/device/paths-vllm-cuda.toml")["vllm-ngram"])
for r in engine.generate(reqs):
    print(r.key, r.error, r.completion_tokens, r.drafted_tokens, r.accepted_tokens, repr(r.text[:80]))
engine.close()
PYEOF
}

replay_vllm() {  # the 253 demo calls: each pair with its noise floor (the target at another max_num_seqs)
    local db="$OUT/vllm.duckdb" pair
    rm -f "$db"
    for pair in ${VLLM_PAIRS:-"vllm-target vllm-ngram" "vllm-target vllm-selfdraft" "vllm-target-inv vllm-ngram-inv" \
                 "vllm-target-fp32 vllm-ngram-fp32" "vllm-target vllm-target-eager"}; do
        set -- $pair
        /usr/bin/time -f "$1 vs $2: %e s wall" "$PY" -m toolaudit replay traces/demo.jsonl --no-probe \
            --paths scripts/device/paths-vllm-cuda.toml --baseline "$1" --candidate "$2" --noise-floor --db "$db" \
            || echo "$1 vs $2 failed"
        "$PY" -m toolaudit summary --db "$db" --json > "$OUT/vllm-$1-$2.json" || true
    done
}

print_versions() {
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
    "$PY" - <<'PYEOF'
import json, platform, torch, transformers
info = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(), "transformers": transformers.__version__,
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "capability": torch.cuda.get_device_capability(0) if torch.cuda.is_available() else None}
try:
    import triton
    info["triton"] = triton.__version__
except ImportError:
    info["triton"] = None
print(json.dumps(info))
PYEOF
}

replay_demo() {  # the demo's 253 calls through target and spec-ngram on CUDA, bf16 and float32, into one DuckDB file
    local db="$OUT/gpu.duckdb"
    rm -f "$db"
    for pair in "target spec-ngram" "target-fp32 spec-ngram-fp32"; do
        set -- $pair
        /usr/bin/time -f "$1 vs $2: %e s wall" "$PY" -m toolaudit replay traces/demo.jsonl \
            --paths scripts/device/paths-cuda.toml --baseline "$1" --candidate "$2" --db "$db" || return 1
    done
}

# In the order of what matters most if the call's own limit cuts the run short: the tests, the demo's drift
# figures, then the bench (bf16: the goals' dtype; float32's drift is the replay step's).
export -f install_bundle  # the steps' functions run in a child bash: what they call must be exported too
step install 120 install_pack
step versions 30 print_versions
step tests 210 "$PY" -m pytest -m gpu tests/gpu -v -rs -p no:cacheprovider --junitxml="$OUT/tests.xml" \
    ${TESTS_K:+-k "$TESTS_K"}
step replay 150 replay_demo
step step 120 "$PY" benchmarks/bench_gpu_step.py --json "$OUT/step.json"
step replay-dynamic 120 "$PY" -m toolaudit replay traces/demo.jsonl --paths scripts/device/paths-cuda.toml \
    --baseline target-dynamic --candidate spec-ngram-dynamic --db "$OUT/dynamic.duckdb"
step bench 300 "$PY" benchmarks/bench_engine.py --device cuda --setups ${BENCH_SETUPS:-bf16-native} \
    --prompts 24 --json "$OUT/bench.json"
# Sampled decoding (issue 34): N samples of a call as rows of one batch against N independent requests, and the
# broken samplers' power table with the calibration, on CUDA in bf16.
step samples 120 "$PY" benchmarks/bench_samples.py --device cuda --samples 16 --calls 8 --rounds 2
power_tables() {  # one table per temperature in POWER_T, each database kept under $OUT for a later look
    local t
    for t in ${POWER_T:-0.7}; do
        "$PY" benchmarks/bench_sampled_power.py --device cuda --dtype bfloat16 --calls "${POWER_CALLS:-24}" \
            --samples "${POWER_N:-48}" --temperature "$t" --max-tokens "${POWER_MAX_TOKENS:-64}" \
            ${POWER_DRAFT:+--draft "$POWER_DRAFT"} --db "$OUT/power-t$t.duckdb" || return 1
    done
}
step power "${POWER_LIMIT:-300}" power_tables
# vLLM 0.26 on the GPU (issue 42): its bundle staged by the calls before (docs/gpu.md, "vLLM"), then one engine's
# smoke test and the demo's pairs, each with its noise floor.
export PACK_VLLM=${TOOLAUDIT_PACK_VLLM:-/tmp/toolaudit-pack-vllm}
step vllm-install 240 install_vllm
step vllm-smoke 240 vllm_smoke
step vllm-replay "${VLLM_LIMIT:-480}" replay_vllm
cat "$OUT/steps.txt"
