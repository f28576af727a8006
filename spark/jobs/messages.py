"""spark-submit spark/jobs/messages.py --help: a topic to Parquet (ferry_spark.jobs.messages)."""
from ferry_spark.jobs.messages import main

raise SystemExit(main())
