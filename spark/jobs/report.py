"""spark-submit spark/jobs/report.py --help: the pipeline report (ferry_spark.jobs.report)."""
from ferry_spark.jobs.report import main

raise SystemExit(main())
