# Alternating A/B on one kept 30 s TPC-C history: Spark's own daemon (pyspark.daemon,
# which imports PySpark from Spark's source zips) against Ordo's (executor.replay.spark_daemon).
cd /work/main
for i in 1 2 3; do for m in 'local[1]' 'local[2]'; do for d in zip installed; do
  if [ $d = zip ]; then X="--conf spark.python.daemon.module=pyspark.daemon"; else X=""; fi
  s=$(date +%s.%N); .venv/bin/ordo replay verify --data-dir /tmp/br_s11 --master "$m" --out /tmp/vcmp --json $X 2>/dev/null > /tmp/vcmp.json; e=$(date +%s.%N)
  python3 -c "
import json; d=json.load(open('/tmp/vcmp.json')); s=d.get('summary',d); print(json.dumps({'round':$i,'master':'$m','daemon':'$d','job_s':s['job_s'],'task_s_sum':s['task_s_sum'],'txns':s['txns'],'wall_s':round($e-$s,2)}))"
done; done; done
