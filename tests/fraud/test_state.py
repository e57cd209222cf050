"""The API's reader of the jobs' state takes a job and a namespace from any client: they are names the
project gives, never a path; the checkpoint it opens is inside FRAUD_HOME/checkpoints whatever they are;
what it answers names no absolute path.

Property-based over the two parameters, through the API (as a client sends them) and to the reader
itself. A real reader over a FRAUD_HOME of its own, with a checkpoint of another stack beside it that a
``..`` would reach: nothing is committed anywhere, so no read gets as far as Spark.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from api.app import create_app
from contracts.errors import ConfigError, NotFoundError
from contracts.settings import Settings
from fraud.state import StateService, state_checkpoint

CARD = "0123456789abcdef0123456789abcdef"
#: Names a client may send: traversals, absolute paths, encodings, and the names the project gives.
NAMES = st.one_of(
    st.text(max_size=60),
    st.text(alphabet="./-_%~a\\0", max_size=30),
    st.sampled_from(
        [
            "",
            ".",
            "..",
            "../..",
            "../../other/checkpoints",
            "/etc",
            "/",
            "v2/../..",
            "%2e%2e",
            "..%2f..",
            "a" * 41,
            "-v2",
            "V2",
            "v2",
            "ab-3",
            "features",
            "pipeline",
            "scoring",
        ]
    ),
)


#: Settings made once (each is read from the environment); a test gives its own home.
SETTINGS = Settings()


def no_spark() -> None:
    raise AssertionError("nothing is committed: no read may start Spark")


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A FRAUD_HOME, and beside it another stack's checkpoints, which no name may reach."""
    root = tmp_path_factory.mktemp("stacks")
    for job in ("features", "pipeline"):
        (root / "other" / "checkpoints" / job).mkdir(parents=True)
    (root / "home" / "checkpoints").mkdir(parents=True)
    return root / "home"


def service(home: Path) -> StateService:
    return StateService(SETTINGS.model_copy(update={"home": home}), session=no_spark)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def api(home: Path) -> TestClient:
    return TestClient(create_app(None, states=service(home)))


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(job=NAMES, namespace=NAMES)
def test_any_job_and_namespace_is_a_checkpoint_inside_fraud_home_or_refused(
    home: Path, job: str, namespace: str
) -> None:
    root = (home / "checkpoints").resolve()
    try:
        checkpoint = state_checkpoint(SETTINGS.model_copy(update={"home": home}), job, namespace)
    except ConfigError as exc:
        assert str(root.parent) not in str(exc) and str(home) not in str(exc)
        return
    assert job in ("features", "pipeline")
    assert checkpoint == (root / namespace / job if namespace else root / job)
    assert checkpoint.is_relative_to(root)


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None, max_examples=60)
@given(job=NAMES, namespace=NAMES, route=st.sampled_from([f"/state/cards/{CARD}", "/state/terminals/T-1"]))
def test_the_api_answers_any_job_and_namespace_with_a_422_or_a_404_that_names_no_path(
    api: TestClient, home: Path, job: str, namespace: str, route: str
) -> None:
    answer = api.get(route, params={"job": job, "namespace": namespace})
    assert answer.status_code in (404, 422), answer.text
    assert str(home.parent) not in answer.text
    if answer.status_code == 404:
        detail = answer.json()["detail"]
        where = f"FRAUD_HOME/checkpoints/{namespace}/{job}" if namespace else f"FRAUD_HOME/checkpoints/{job}"
        assert detail.startswith(f"no checkpoint at {where}:"), detail


def test_a_traversal_the_issue_found_is_refused_and_the_other_stack_is_not_read(
    api: TestClient, home: Path
) -> None:
    answer = api.get(
        f"/state/cards/{CARD}", params={"job": "pipeline", "namespace": "../../other/checkpoints"}
    )
    assert answer.status_code == 422
    with pytest.raises(ConfigError, match="namespace"):
        service(home).card("pipeline", "../../other/checkpoints", CARD)
    with pytest.raises(ConfigError, match="no stateful job"):
        service(home).card("../other/checkpoints/pipeline", "", CARD)


def test_a_link_out_of_fraud_home_is_refused(home: Path) -> None:
    (home / "checkpoints" / "linked").symlink_to(home.parent / "other" / "checkpoints")
    with pytest.raises(ConfigError, match="leads outside FRAUD_HOME"):
        service(home).card("pipeline", "linked", CARD)


def test_what_is_not_there_is_said_relative_to_fraud_home(home: Path) -> None:
    with pytest.raises(NotFoundError) as caught:
        service(home).terminal("features", "v2", "T-1")
    assert str(caught.value).startswith("no checkpoint at FRAUD_HOME/checkpoints/v2/features:")
