"""Training metrics: `writer.MetricsWriter` (JSONL, TensorBoard, W&B) and `report.write_report`."""
