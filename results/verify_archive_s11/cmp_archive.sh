# Alternating A/B on one kept 30 s TPC-C history (/tmp/br_s11): the driver JVM with
# set-up's class-data archive (the default) against without it (a user's
# extraJavaOptions replaces ours: tier 1 only). wall_s is the whole `ordo` process.
cd /work/main
for i in 1 2 3; do for a in archive jars; do
  if [ $a = jars ]; then X="--conf spark.driver.extraJavaOptions=-XX:TieredStopAtLevel=1"; else X=""; fi
  s=$(date +%s.%N); .venv/bin/ordo replay verify --data-dir /tmp/br_s11 --master 'local[2]' --out /tmp/vcmp --json $X 2>/dev/null > /tmp/vcmp.json; e=$(date +%s.%N)
  python3 -c "
import json; d=json.load(open('/tmp/vcmp.json')); s=d.get('summary',d); print(json.dumps({'round':$i,'driver':'$a','job_s':s['job_s'],'task_s_sum':s['task_s_sum'],'wall_s':round($e-$s,2)}))"
done; done
