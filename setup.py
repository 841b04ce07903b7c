"""BookKeeper appliance: a replicated, durable write-ahead log on one host."""

from setuptools import find_packages, setup

setup(
    name="bk-appliance",
    version="0.1.0",
    description="Apache BookKeeper's replicated log as a single-host appliance",
    python_requires=">=3.11",
    packages=find_packages(include=["appliance*", "ipc*", "storage*", "cli*"]),
    package_data={"ipc": ["PROTOCOL.md"]},
    install_requires=[
        "pyzmq>=25,<28",
        "numpy>=1.26,<3",
        "psutil>=5.9,<8",
        "sqlite-utils>=3.35,<5",
        "click>=8.1,<9",
        # kazoo: the maintained ZooKeeper client; the zk:// metadata backend.
        "kazoo>=2.9,<3",
        # crc32c: hardware-accelerated CRC32C in C (SSE4.2/ARMv8); a pure
        # Python CRC would cost more than the fsync on the hot path.
        "crc32c>=2.3,<3",
        # pynacl: libsodium's sealed boxes; ledger keys sealed to the cluster
        # key in metadata (appliance.meta.custody), opened by repairing bookies.
        "pynacl>=1.5,<2",
        # prometheus_client: the maintained Prometheus library; each bookie's
        # /metrics (appliance.bookie.metrics), not a hand-written exposition.
        "prometheus_client>=0.17,<1",
    ],
    extras_require={
        "spark": [
            # 4.1: filter pushdown for Python data sources (appliance.spark.filters).
            "pyspark>=4.1,<5",
            # pyspark's Python data sources exchange Arrow record batches.
            "pyarrow>=15",
            # pandas < 3: pyspark 4.1 warns that it does not fully support
            # pandas 3 yet and recommends 2.x.
            "pandas>=2.0,<3",
        ],
        "dev": [
            "pytest>=8,<10",
            "pytest-timeout>=2.2,<3",
            "ruff>=0.4",
            # bkctl bench --plot
            "matplotlib>=3.7,<4",
            # an S3-compatible server for the cold storage tests (tests/cold):
            # pure Python from PyPI, started in the test on a free port
            "moto[server]>=5,<6",
        ],
    },
    entry_points={"console_scripts": ["bkctl=cli.main:main"]},
)
