# Airflow + airflow-finalckpt, for the official apache-airflow Helm chart (images.airflow) and
# the jobs of helm/airflow-finalckpt. Build from the repository root:
#   docker build -t registry.example.com/airflow-finalckpt:0.1.0 .
# The base tag pins the Airflow version CI tests (constraints/newest.txt: 3.3.2) and a Python
# version CI tests (3.11, a classifier of pyproject.toml); tests/helm/test_dockerfile.py checks both.
FROM apache/airflow:3.3.2-python3.11

# PySpark needs a Java runtime: JRE 17 from Debian, installed as root. (Debian 13 "trixie"
# no longer ships openjdk-17; should the base image move to it, JRE 21, which Spark 4 supports
# too, is installed instead.) Debian slim images have no man directories, which the JRE's
# postinst needs.
USER root
RUN set -eux; \
    mkdir -p /usr/share/man/man1; \
    apt-get update; \
    apt-get install -y --no-install-recommends openjdk-17-jre-headless \
      || apt-get install -y --no-install-recommends openjdk-21-jre-headless; \
    ln -sfn "$(dirname "$(dirname "$(readlink -f "$(command -v java)")")")" /usr/lib/jvm/jre; \
    apt-get autoremove -yqq --purge; \
    apt-get clean; \
    rm -rf /var/lib/apt/lists/*
ENV JAVA_HOME=/usr/lib/jvm/jre

# Back to the unprivileged airflow user (uid 50000) for pip and at run time.
USER airflow
COPY --chown=airflow:root pyproject.toml README.md /opt/finalckpt/src/
COPY --chown=airflow:root airflow_finalckpt /opt/finalckpt/src/airflow_finalckpt
# Install the plugin with the spark and postgres extras; the airflow extra adds the Spark
# provider, and apache-airflow stays at the image's own version ("apache-airflow==$AIRFLOW_VERSION"
# is repeated, as the official image docs ask, so that pip never up- or downgrades Airflow).
# pyspark and pyspark-client (the Spark provider's) install one `pyspark` package: both at one
# version, the one CI tests (constraints/newest.txt; docs/compatibility.md).
ARG PYSPARK_VERSION=4.2.0
RUN pip install --no-cache-dir \
        "apache-airflow==${AIRFLOW_VERSION}" \
        "pyspark==${PYSPARK_VERSION}" "pyspark-client==${PYSPARK_VERSION}" \
        "/opt/finalckpt/src[airflow,spark,postgres]" \
    && python -c "import airflow_finalckpt, pyspark, psycopg; print('pyspark', pyspark.__version__)" \
    && finalckpt --version
