"""The PySpark jobs over the lake: `aggregates` (streaming per-minute aggregates), `reports` (batch reports) and
`alerts` (a threshold rule whose alerts go back through the gateway as MQTT).

Run them locally with `tidewire pipeline run <job> --lake DIR [options]` (or `python -m tidewire.pipeline.cli run ...`),
or on a cluster with spark-submit. For that, build the artifact from the installed package:

    tidewire pipeline package -o dist/tidewire-pipeline.zip [--master spark://HOST:7077] [--lake DIR]

It writes the zip for `--py-files` (exactly the modules the jobs import: `pipeline.artifact`) and one launcher
per job, spark-submit's application file, in `dist/jobs/`; it prints the spark-submit line of each job.

Standalone cluster (Python apps run in client deploy mode there; the driver is the submitting machine):

    spark-submit --master spark://spark-master:7077 --deploy-mode client \\
      --conf spark.sql.shuffle.partitions=64 \\
      --py-files dist/tidewire-pipeline.zip \\
      dist/jobs/aggregates.py --lake /shared/lake

    spark-submit --master spark://spark-master:7077 --py-files dist/tidewire-pipeline.zip \\
      dist/jobs/reports.py --lake /shared/lake --top 20

    TIDEWIRE_MQTT_URL=mqtt://alerts:PASSWORD@gateway:1883 \\
    spark-submit --master spark://spark-master:7077 --py-files dist/tidewire-pipeline.zip \\
      dist/jobs/alerts.py --lake /shared/lake --rule 'temperature > 80 for 1 minute'

Kubernetes (cluster deploy mode; an image FROM apache/spark with python3, pyarrow and paho-mqtt installed and
the output of `tidewire pipeline package -o /opt/tidewire/tidewire-pipeline.zip` in it; the lake on a
ReadWriteMany claim):

    spark-submit --master k8s://https://KUBE-API:6443 --deploy-mode cluster --name tidewire-aggregates \\
      --conf spark.kubernetes.container.image=REGISTRY/tidewire-spark:4 \\
      --conf spark.kubernetes.authenticate.driver.serviceAccountName=spark \\
      --conf spark.kubernetes.driver.volumes.persistentVolumeClaim.lake.options.claimName=tidewire-lake \\
      --conf spark.kubernetes.driver.volumes.persistentVolumeClaim.lake.mount.path=/lake \\
      --conf spark.kubernetes.executor.volumes.persistentVolumeClaim.lake.options.claimName=tidewire-lake \\
      --conf spark.kubernetes.executor.volumes.persistentVolumeClaim.lake.mount.path=/lake \\
      --py-files local:///opt/tidewire/tidewire-pipeline.zip \\
      local:///opt/tidewire/jobs/aggregates.py --lake /lake --every 30s

    (alerts: the same with `local:///opt/tidewire/jobs/alerts.py --lake /lake --rule '...'` and the
    gateway URL from a secret, never on the command line:
      --conf spark.kubernetes.driver.secretKeyRef.TIDEWIRE_MQTT_URL=tidewire-mqtt:url)

With the lake in an object store instead of a volume, pass `--lake s3a://BUCKET/lake` (hadoop-aws and its AWS
SDK jar baked into the image, `--conf spark.hadoop.fs.s3a.*` for the endpoint and credentials); the alerts job
then needs `--state /a/local/or/mounted/file.json` for its published-alerts record, which is a local file.
Under spark-submit the jobs' own `--master` is ignored, and neither the driver address nor PYSPARK_PYTHON is
forced to this machine's values (they are set only for a local master).
"""
