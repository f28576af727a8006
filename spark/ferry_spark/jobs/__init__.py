"""Ferry's Spark jobs: trace spans and topics to Parquet, and the pipeline report.

Each job is a module with `main(argv=None)` (what `spark/jobs/<job>.py` calls under
`spark-submit`) and a function tests and notebooks call with their own session:
`traces.load_spans` / `traces.write_spans`, `messages.export_topic`,
`report.run_report`. docs/spark.md says where each figure comes from.
"""
