"""The `ferry` source in a session ferry_spark never touched: Spark 4 registers it itself."""
from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.client.conftest import Mesh
from tests.spark.conftest import new_topic, send_messages

pytestmark = [pytest.mark.slow, pytest.mark.integration]

# A user's own program: a plain builder, no ferry_spark import, no register().
PROGRAM = """
import sys
from pyspark.sql import SparkSession
spark = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false") \\
    .getOrCreate()
spark.sparkContext.setLogLevel("ERROR")
df = spark.read.format("ferry").option("namesrv", sys.argv[1]).option("topic", sys.argv[2]) \\
    .load()
print("ROWS", df.count(), sorted(r.body for r in df.select("body").collect())[:2])
assert "ferry_spark" not in sys.modules   # the driver never imported it
spark.stop()
"""


def test_plain_session_reads_format_ferry(spark_mesh: Mesh, tmp_path: Path) -> None:
    topic = new_topic(spark_mesh, "spark-auto", queues=2)
    asyncio.run(send_messages(spark_mesh.namesrv, topic, range(30)))
    venv_bin = str(Path(sys.executable).parent)
    # As a user with the virtualenv active: its python3 first on PATH (Spark's workers
    # run `python3`); nothing else of Ferry's is set.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK")}
    env["PATH"] = venv_bin + os.pathsep + env.get("PATH", "")
    out = subprocess.run([sys.executable, "-c", PROGRAM, spark_mesh.namesrv, topic],
                         env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "ROWS 30 [b'body-0\\x00', b'body-1\\x01']" in out.stdout
