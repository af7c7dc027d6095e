#!/usr/bin/env bash
# ZeRO-2 and ZeRO-3 (distributed.zero_stage; zero.c) train exactly like one rank:
#  1. stages 2 and 3 on dp2, dp4, dp2 x tp2 (with sequence parallelism and recomputation),
#     dp2 x pp2 (1F1B), dp2 x cp2 and dp2 x tp2 x pp2 (the embedding tied to the head, across the
#     pipeline and on one stage), half of them with gradient clipping at 0.5, and dp3 (units that
#     do not divide by 3: the last piece short) give the single-rank losses and final weights
#     (tolerances in tests/layout_harness.sh);
#  2. checkpoints hold whole tensors: saved at step 5 under stage 3, resumed under stages 0, 1
#     and 2 (and dp4's other shards), and saved under stage 0, resumed under stage 3, steps 6..10
#     match the run that never stopped;
#  3. memory: on dp2 (no checkpoint written, whose save makes the weights whole for a moment), the
#     allocator's own peak per rank is within 5% of the formula, computed here from the model's
#     shapes: P parameters, S = P/2 the shard, U the largest unit (a decoder layer), A the
#     activations of the stage-0 run's table: stage 0 4(4P) + A, stage 1 4(2P + 2S) + A,
#     stage 2 4(P + 3S + 2U) + A (a unit's gradient being made, the previous one's in flight),
#     stage 3 4(4S + 4U) + A (two units' weights gathered, the one computing and the next one's
#     prefetch, and two units' gradients);
#  4. the prefetch overlaps: in a dp2 stage-3 trace, every decoder layer's forward span on rank 0
#     holds the start of the next unit's all-gather;
#  5. what stages 2 and 3 do not handle is refused in one line (experts, interleaved pipelines,
#     zero1 with another stage).
cd "$(dirname "$0")/.." && source tests/layout_harness.sh
STEPS=10
run_layout base ga=4
run_layout base_clip clip=0.5 ga=4
run_layout base_tied tied=true ga=4
for s in 2 3; do
    check_layout base z${s}_dp2 dp=2 ga=2 zero=$s
    check_layout base_clip z${s}_dp4_clip dp=4 ga=1 zero=$s clip=0.5
    check_layout base z${s}_dp2_tp2_sp_recompute dp=2 tp=2 ga=2 zero=$s sp=true recompute=true
    check_layout base_clip z${s}_dp2_pp2_1f1b_clip dp=2 pp=2 ga=2 engine=1f1b zero=$s clip=0.5
    check_layout base z${s}_dp2_cp2 dp=2 cp=2 ga=2 zero=$s
    check_layout base_tied z${s}_dp2_tp2_pp2_tied dp=2 tp=2 pp=2 ga=2 tied=true zero=$s
    check_layout base_tied z${s}_dp2_tied dp=2 ga=2 tied=true zero=$s
done
check_layout base_clip z3_dp2_tp2_pp2_clip dp=2 tp=2 pp=2 ga=2 clip=0.5 zero=3
# dp3: 656512 parameters, each unit's pieces ceil(size / 3)
run_layout base_12 ga=6
check_layout base_12 z3_dp3 dp=3 ga=2 zero=3

# 2. resume across stages
run_layout saved_z3 dp=2 ga=2 zero=3 save=5
run_layout saved_z0 dp=2 ga=2 save=5
resume_layout base saved_z3 z3_resumed_stage0 dp=2 ga=2
resume_layout base saved_z3 z3_resumed_stage1_dp4 dp=4 ga=1 zero=1
resume_layout base saved_z3 z3_resumed_stage2 dp=2 ga=2 zero=2
resume_layout base saved_z0 z0_resumed_stage3 dp=2 ga=2 zero=3

# 3. memory against the formula, from the shapes (the harness's model: hidden 128, MLP 256,
# 8 heads of 16, 4 kv heads, vocabulary 256, 4 layers, untied)
for s in 0 1 2 3; do run_layout mem_z$s dp=2 ga=2 zero=$s save=0; done
awk -v C=128 -v I=256 -v H=8 -v KV=4 -v V=256 -v L=4 -v dir="$HARNESS_DIR" '
    function table(run, col,   line, f, n, c, v) { # rank 0 of the memory table: column col
        while ((getline line < (dir "/" run "/log")) > 0) {
            if (line ~ /^memory per rank, MB/) { f = 1; continue }
            n = split(line, c, " ")
            if (f && c[1] == "rank") for (k = 1; k <= n; k++) if (c[k] == col) v = k
            if (f && c[1] == "0") { close(dir "/" run "/log"); return c[v] * 1e6 }
        }
    }
    function peak(run,   line, c) {
        while ((getline line < (dir "/" run "/log")) > 0)
            if (line ~ /^the allocator.s own peak/) { split(line, c, " "); close(dir "/" run "/log")
                                                      return c[6] * 1e6 }
    }
    BEGIN {
        D = C / H
        U = 2 * C + H * D * C * 2 + 2 * KV * D * C + 3 * C * I   # a decoder layer: the largest unit
        P = V * C + L * U + C + V * C; S = P / 2
        A = table("mem_z0", "activations")
        want[0] = 4 * (4 * P) + A; want[1] = 4 * (2 * P + 2 * S) + A
        want[2] = 4 * (P + 3 * S + 2 * U) + A; want[3] = 4 * (4 * S + 4 * U) + A
        bad = 0
        for (s = 0; s < 4; s++) {
            got = peak("mem_z" s); r = got / want[s]
            ok = r > 0.95 && r < 1.05
            printf "%s stage %d memory per rank: allocator peak %.3f MB, formula %.3f MB (%.3f)\n",
                   ok ? "ok  " : "FAIL", s, got / 1e6, want[s] / 1e6, r
            bad += !ok
        }
        exit bad
    }' || harness_failures=$((harness_failures + 1))

# 4. the prefetch, from the trace's spans
run_layout traced dp=2 ga=2 zero=3 save=0 trace="$HARNESS_DIR/traced/trace.json"
python3 - "$HARNESS_DIR/traced" <<'PY' || harness_failures=$((harness_failures + 1))
import json, sys
d = sys.argv[1]
events = json.load(open(f"{d}/trace.json"))["traceEvents"]
gathers = [e["ts"] for e in events if e.get("pid") == 0 and e.get("ph") == "b"
           and "gather" in e["name"]]
layers = [e for e in events if e.get("pid") == 0 and e.get("ph") == "X"
          and "layer" in e.get("args", {}) and e.get("cat") == "forward"]
inside = [l for l in layers if any(l["ts"] <= g < l["ts"] + l["dur"] for g in gathers)]
ok = len(layers) > 0 and len(inside) == len(layers)
print(f"{'ok  ' if ok else 'FAIL'} prefetch: {len(inside)} of rank 0's {len(layers)} layer "
      f"forwards hold the start of an all-gather ({len(gathers)} all-gathers traced)")
sys.exit(0 if ok else 1)
PY

# 5. refused in one line
refused() { # NAME WANT key=value...
    local name=$1 want=$2; shift 2
    local dir=$HARNESS_DIR/$name
    run_layout "$name" "$@" >/dev/null 2>&1
    harness_failures=$((harness_failures - 1)) # run_layout counted the refusal as a failure
    local lines
    lines=$(grep -c "zero_stage" "$dir/log")
    if grep -q "$want" "$dir/log" && [ "$lines" -ge 1 ]; then
        echo "ok   $name: $(grep -m1 "zero_stage" "$dir/log" | cut -c1-150)"
    else
        echo "FAIL $name: no line naming zero_stage and '$want'"; tail -n 3 "$dir/log"
        harness_failures=$((harness_failures + 1))
    fi
}
refused refused_experts "model.num_experts" dp=2 ga=2 zero=3 experts=4
refused refused_interleaved "pp_virtual_stages" dp=2 pp=2 ga=4 vstages=2 layers=4 zero=2
refused refused_zero1 "zero1 is stage 1" dp=2 ga=2 zero=3 zero1=true
[ $harness_failures -eq 0 ]
