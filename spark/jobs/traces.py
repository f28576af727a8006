"""spark-submit spark/jobs/traces.py --help: trace spans to Parquet (ferry_spark.jobs.traces)."""
from ferry_spark.jobs.traces import main

raise SystemExit(main())
