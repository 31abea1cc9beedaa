"""Reads a TensorBoard log directory with TensorBoard's own reader and prints its scalars as JSON:
{"tag": [[step, value], ...], ...}, plus "_files": the event files it found."""
import glob
import json
import os
import sys

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

log_dir = sys.argv[1]
accumulator = EventAccumulator(log_dir, size_guidance={"scalars": 0})
accumulator.Reload()
out = {tag: [[event.step, event.value] for event in accumulator.Scalars(tag)]
       for tag in accumulator.Tags()["scalars"]}
out["_files"] = sorted(os.path.basename(p) for p in glob.glob(os.path.join(log_dir, "*tfevents*")))
print(json.dumps(out))
