cd /work/main
for i in 1 2 3; do for m in 'local[1]' 'local[2]'; do for c in c2 c1; do
  if [ $c = c2 ]; then X="--conf spark.driver.extraJavaOptions=-XX:+UseG1GC"; else X=""; fi
  s=$(date +%s.%N); .venv/bin/ordo replay verify --data-dir /tmp/br_s10b --master "$m" --out /tmp/vcmp --json $X 2>/dev/null > /tmp/vcmp.json; e=$(date +%s.%N)
  python3 -c "
import json; d=json.load(open('/tmp/vcmp.json')); s=d.get('summary',d); print(json.dumps({'round':$i,'master':'$m','jit':'$c','job_s':s['job_s'],'task_s_sum':s['task_s_sum'],'wall_s':round($e-$s,2)}))"
done; done; done
