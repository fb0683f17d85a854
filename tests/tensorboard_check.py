"""`cqk train`'s TensorBoard event files, read with TensorBoard's own reader.

A tiny run is paused at step 6, its newest checkpoint removed (so the resume
starts again from step 4, as after a crash) and its event file torn in the
middle of the last record. After the resume every tag is one curve, stepping
up, equal (as float32) to the scalars of metrics.jsonl: read from scratch, and
by a reader that was already reading the run before the resume (a TensorBoard
left open), which must move on to the new file.

    tensorboard_check.py CQK_TOOL WORK_DIR
"""
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy

from tensorboard.backend.event_processing import event_accumulator

cqk, work = sys.argv[1], Path(sys.argv[2])
shutil.rmtree(work, ignore_errors=True)
run = work / "run"
overrides = ["model.width=32", "model.layers=2", "model.heads=4", "data.seq_len=16", "data.batch_size=4",
             "data.recall.vocab_size=32", "data.recall.pairs=2", "data.recall.train_examples=200",
             "data.recall.eval_examples=16", "train.steps=12", "train.warmup_steps=2", "train.eval_every=4",
             "train.eval_batches=2", "train.log_every=2", "train.checkpoint_every=2", "train.keep_checkpoints=3",
             "train.threads=1", "train.device=cpu"]


def cqk_train(*args):
    done = subprocess.run([cqk, "train", *args], capture_output=True, text=True)
    assert done.returncode == 0, f"cqk train {args} exited {done.returncode}:\n{done.stderr}"
    return done.stderr + done.stdout


cqk_train("--run-dir", str(run), "--max-steps", "6", *[a for o in overrides for a in ("--set", o)])
(run / "checkpoints" / "step-000000006.ckpt").unlink()
events = list((run / "tb").glob("*tfevents*"))
assert len(events) == 1, events
data = events[0].read_bytes()
events[0].write_bytes(data[:-7])  # a torn last record (steps 5-6's scalars)

live = event_accumulator.EventAccumulator(str(run / "tb"), size_guidance={event_accumulator.SCALARS: 0})
live.Reload()
assert [e.step for e in live.Scalars("train/loss")] == [2, 4], live.Scalars("train/loss")
cqk_train("--resume", str(run))
live.Reload()


# The expected curves: metrics.jsonl's scalars under their tags (tensorboard_log.h).
def tags_of(line):
    for key, value in line.items():
        if key in ("step", "tokens", "time"):
            continue
        if key == "coupling":
            sums = {}
            for layer in value:
                for name, figure in layer.items():
                    if name != "layer":
                        yield f"coupling/layer{layer['layer']}/{name}", figure
                        sums.setdefault(name, []).append(figure)
            for name, figures in sums.items():
                yield f"coupling/mean/{name}", sum(figures) / len(figures)
            continue
        split = next((s for s in ("valid", "test") if key.startswith(s + "_")), None)
        yield (f"{split}/{key[len(split) + 1:]}" if split else f"train/{key}"), value


expected = {}
lines = [json.loads(text) for text in (run / "metrics.jsonl").read_text().splitlines()]
steps = [line["step"] for line in lines if "loss" in line]
assert steps == [2, 4, 6, 8, 10, 12], f"metrics.jsonl training steps {steps}: each once, in order"
for line in lines:
    for tag, value in tags_of(line):
        expected.setdefault(tag, []).append((line["step"], value))

accumulator = event_accumulator.EventAccumulator(str(run / "tb"), size_guidance={event_accumulator.SCALARS: 0,
                                                                                  event_accumulator.TENSORS: 0})
accumulator.Reload()
found = sorted(accumulator.Tags()["scalars"])
assert found == sorted(expected), f"tags differ:\n  tensorboard {found}\n  metrics.jsonl {sorted(expected)}"
for tag, points in expected.items():
    read = [(event.step, event.value) for event in accumulator.Scalars(tag)]
    assert [s for s, _ in read] == [s for s, _ in points], f"{tag}: steps {read} vs {points}"
    for (step, got), (_, want) in zip(read, points):
        # simple_value is a float32: exactly the float32 nearest metrics.jsonl's double.
        assert got == float(numpy.float32(want)), f"{tag} at step {step}: tensorboard {got} vs metrics.jsonl {want}"
# The reader that was open across the resume sees the same curves (TensorBoard's
# loader purges the first file's steps after the checkpoint at the new file's session start).
live.Reload()
for tag, points in expected.items():
    steps = [event.step for event in live.Scalars(tag)]
    assert steps == [s for s, _ in points], f"{tag}, read live across the resume: steps {steps} vs {points}"
# The final evaluation's coupling diagnostics are in the curves too.
assert expected["coupling/mean/q_change"][-1][0] == 12, expected["coupling/mean/q_change"]
# Every line has its wall time, which is the event's.
assert all(abs(line["time"] - time.time()) < 600 for line in lines), lines[0]
for tag in ("train/loss", "train/lr", "train/grad_norm", "train/tokens_per_s", "train/step_time_s", "train/rss_mb",
            "valid/loss", "valid/ppl", "valid/accuracy", "valid/seen_loss", "test/loss", "coupling/mean/q_change",
            "coupling/layer0/k_change"):
    assert tag in expected, f"{tag} missing"

config = accumulator.Tensors("config")
assert len(config) == 1 and config[0].step == 0, config
text = config[0].tensor_proto.string_val[0].decode()
assert "coupling:" in text and "tensorboard: true" in text, text
print(f"tensorboard check: {len(expected)} tags, {sum(map(len, expected.values()))} points, one curve each; "
      f"config text {len(text)} bytes")
