"""The PySpark jobs over the lake: `aggregates` (streaming per-minute aggregates), `reports` (batch reports) and
`alerts` (a threshold rule whose alerts go back through the gateway as MQTT).

Run them locally with `tidewire pipeline run <job> --lake DIR [options]` (or `python -m pipeline.cli run ...`),
or on a cluster with spark-submit: each job module is also a script. The script imports `pipeline` from the
zip given to `--py-files`, built from a checkout with the standard library only:

    python -m zipfile -c tidewire-pipeline.zip pipeline/

What runs where: the jobs use no Python UDFs, so executors need only Spark itself; the driver needs Python
3.11+, pyarrow (the lake's schemas) and, for `alerts`, paho-mqtt. Nothing is downloaded at run time: no
`--packages`; jars (e.g. hadoop-aws for s3a://) must already be in the image or `$SPARK_HOME/jars`. The lake
must be visible at the same path or URI to the driver and every executor: a shared filesystem (NFS, a
ReadWriteMany volume) or an object store.

Standalone cluster (Python apps run in client deploy mode there; the driver is the submitting machine):

    spark-submit --master spark://spark-master:7077 --deploy-mode client \\
      --conf spark.sql.shuffle.partitions=64 \\
      --py-files tidewire-pipeline.zip \\
      pipeline/jobs/aggregates.py --lake /shared/lake

    spark-submit --master spark://spark-master:7077 --py-files tidewire-pipeline.zip \\
      pipeline/jobs/reports.py --lake /shared/lake --top 20

    TIDEWIRE_MQTT_URL=mqtt://alerts:PASSWORD@gateway:1883 \\
    spark-submit --master spark://spark-master:7077 --py-files tidewire-pipeline.zip \\
      pipeline/jobs/alerts.py --lake /shared/lake --rule 'temperature > 80 for 1 minute'

Kubernetes (cluster deploy mode; an image FROM apache/spark with python3, pyarrow and paho-mqtt installed and
this checkout's zip and `pipeline/jobs/*.py` copied to /opt/tidewire; the lake on a ReadWriteMany claim):

    spark-submit --master k8s://https://KUBE-API:6443 --deploy-mode cluster --name tidewire-aggregates \\
      --conf spark.kubernetes.container.image=REGISTRY/tidewire-spark:4 \\
      --conf spark.kubernetes.authenticate.driver.serviceAccountName=spark \\
      --conf spark.kubernetes.driver.volumes.persistentVolumeClaim.lake.options.claimName=tidewire-lake \\
      --conf spark.kubernetes.driver.volumes.persistentVolumeClaim.lake.mount.path=/lake \\
      --conf spark.kubernetes.executor.volumes.persistentVolumeClaim.lake.options.claimName=tidewire-lake \\
      --conf spark.kubernetes.executor.volumes.persistentVolumeClaim.lake.mount.path=/lake \\
      --py-files local:///opt/tidewire/tidewire-pipeline.zip \\
      local:///opt/tidewire/pipeline/jobs/aggregates.py --lake /lake --every 30s

    (alerts: the same with `local:///opt/tidewire/pipeline/jobs/alerts.py --lake /lake --rule '...'` and the
    gateway URL from a secret, never on the command line:
      --conf spark.kubernetes.driver.secretKeyRef.TIDEWIRE_MQTT_URL=tidewire-mqtt:url)

With the lake in an object store instead of a volume, pass `--lake s3a://BUCKET/lake` (hadoop-aws and its AWS
SDK jar baked into the image, `--conf spark.hadoop.fs.s3a.*` for the endpoint and credentials); the alerts job
then needs `--state /a/local/or/mounted/file.json` for its published-alerts record, which is a local file.
Under spark-submit the jobs' own `--master` is ignored, and neither the driver address nor PYSPARK_PYTHON is
forced to this machine's values (they are set only for a local master).
"""
