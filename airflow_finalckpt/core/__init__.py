"""The protocol as plain values and pure functions: no Airflow, Spark, SQL or storage here."""
