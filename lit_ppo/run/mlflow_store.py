"""The MLflow store: where runs are tracked, and whether it answers, before anything else starts.

Light on purpose (no Lightning import): ``compare`` reads the store through it in a couple of
seconds. mlflow itself is imported only where a store is used.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

from lit_ppo.errors import TrackingError
from lit_ppo.utils.fs import user_path
from lit_ppo.utils.imports import shadowing_file
from lit_ppo.utils.text import first_line

DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"
DEFAULT_EXPERIMENT = "lit_ppo"
# MLflow's own client retries an unreachable server for minutes; the probe answers in seconds.
PROBE_TIMEOUT_S = 10.0
# Creating or migrating a fresh sqlite store takes seconds; a lock held this long is a stuck process.
STORE_LOCK_TIMEOUT_S = 120.0
DATABASE_SCHEMES = ("postgresql", "mysql", "mssql")
"""The database servers MLflow stores runs in through SQLAlchemy (``postgresql+psycopg2://...`` names a driver)."""
DRIVER_PACKAGES = {"psycopg": "'psycopg[binary]'", "psycopg2": "psycopg2-binary", "MySQLdb": "mysqlclient",
                   "pymysql": "PyMySQL"}
"""Python module of a database driver -> the package that installs it (where the names differ)."""



def check_mlflow_importable() -> None:
    """TrackingError naming the file that stands in for the mlflow package (a module of the user's named
    ``mlflow.py``); MLflow's own error would say only that ``'mlflow' is not a package``."""
    shadow = shadowing_file("mlflow")
    if shadow is not None:
        raise TrackingError(f"{shadow} hides the mlflow package that tracks runs (Python imports the file "
                            f"instead): rename that file")


def resolve_tracking_uri(configured: str | None) -> str:
    """The tracking URI runs go to: ``configured``, else ``MLFLOW_TRACKING_URI``, else the default; a home
    directory in it (``sqlite:///~/mlflow.db``, ``~/mlruns``, ``file:~/mlruns``) expanded, which MLflow
    would take for a directory named ``~``."""
    uri = configured or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI
    for prefix in ("sqlite:///", "file:", ""):
        if uri.startswith(prefix + "~"):
            return prefix + os.fspath(user_path(uri[len(prefix):]))
    return uri


def resolve_experiment(configured: str | None) -> str:
    return configured or os.environ.get("MLFLOW_EXPERIMENT_NAME") or DEFAULT_EXPERIMENT



def sqlite_file(uri: str) -> str | None:
    """The database file of a ``sqlite:///relative`` or ``sqlite:////absolute`` URI (None in memory)."""
    rest = uri[len("sqlite://"):].split("?", 1)[0]
    return rest[1:] if rest.startswith("/") and rest[1:] not in ("", ":memory:") else None


def check_driver(uri: str, source: str) -> None:
    """TrackingError naming the package to install when the database driver of ``uri`` (a
    postgresql / mysql / mssql URI) is not installed; MLflow would fail with a traceback."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    try:
        url = make_url(uri)
        url.get_dialect().import_dbapi()
    except (ArgumentError, NoSuchModuleError) as e:
        raise TrackingError(f"{source}={uri} is invalid: {first_line(e)}") from None
    except ImportError as e:
        shown = url.render_as_string(hide_password=True)
        package = DRIVER_PACKAGES.get(e.name, e.name)
        raise TrackingError(f"{source}={shown} needs the database driver {e.name}, which is not installed: "
                            f"pip install {package}") from None


def probe_server(uri: str, source: str) -> None:
    """Fail at once when nothing answers at ``uri``; any HTTP answer (an error status included) counts."""
    import urllib.error
    import urllib.request

    try:
        urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=PROBE_TIMEOUT_S).close()
    except urllib.error.HTTPError:
        return
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", None) or e
        raise TrackingError(f"MLflow tracking server {uri} is unreachable ({source}): {reason}") from None


def _ensure_experiment(uri: str, experiment: str, artifact_location: str | None) -> None:
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)  # builds the store: creates or migrates a fresh database
    found = client.get_experiment_by_name(experiment)
    if found is not None and found.lifecycle_stage == "deleted":
        raise TrackingError(f"MLflow experiment {experiment!r} is deleted in {uri}: restore it (mlflow experiments "
                            "restore) or choose another name (MLFLOW_EXPERIMENT_NAME)")
    if found is None:
        try:
            client.create_experiment(experiment, artifact_location=artifact_location)
        except MlflowException as e:  # another run created it since
            if e.error_code != "RESOURCE_ALREADY_EXISTS":
                raise


def prepare_store(uri: str, source: str, experiment: str, artifact_location: str | None = None) -> None:
    """Make ``uri`` ready for a run of ``experiment`` before any model loads: a server must answer;
    a sqlite database is created, migrated and given the experiment under ``<db>.lock``, because
    MLflow's schema migrations race when two runs open one fresh database at once. ``source`` names
    where ``uri`` came from, for the error message."""
    check_mlflow_importable()
    scheme = uri.split(":", 1)[0].lower()
    lock: Any = contextlib.nullcontext()
    if scheme in ("http", "https"):
        probe_server(uri, source)
    elif scheme == "sqlite":
        database = sqlite_file(uri)
        if not database:
            raise TrackingError(f"{source}={uri} is invalid: an in-memory database is gone when the process ends, "
                                f"and the run's tracking with it: give a database file, e.g. sqlite:///path.db")
        from filelock import FileLock

        lock = FileLock(database + ".lock", timeout=STORE_LOCK_TIMEOUT_S)
    else:
        if scheme.split("+", 1)[0] in DATABASE_SCHEMES:
            check_driver(uri, source)
        return  # a database server itself is MLflow's business, as are other stores (databricks, ...)
    try:
        with lock:
            _ensure_experiment(uri, experiment, artifact_location)
    except TrackingError:
        raise
    except Exception as e:  # whatever the store says, as one line
        raise TrackingError(f"MLflow tracking store {uri} ({source}) cannot be used: {first_line(e)}") from None
