"""The ablation tools' sites still name the code they switch off (tests/tools/guard_ablation.py).

A site whose snippet no longer occurs exactly once is an ERROR only when someone runs the tool:
until then the guard or number it stands for is checked by nobody, silently. Two guard sites
had gone stale that way after a later change reworded their lines.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "tools"))

import calibration_sites  # noqa: E402
import guard_sites  # noqa: E402
import leak_injection  # noqa: E402

_SITES = [*guard_sites.SITES, *calibration_sites.SITES, *leak_injection.SITES]


@pytest.mark.parametrize("site", _SITES, ids=[site.name for site in _SITES])
def test_every_ablation_site_names_code_that_occurs_exactly_once(site: guard_sites.Site) -> None:
    text = (ROOT / site.path).read_text()
    assert text.count(site.snippet) == 1, f"{site.name}: its snippet occurs {text.count(site.snippet)} times in {site.path}"


def test_every_ablation_site_has_a_name_of_its_own_and_a_known_selection() -> None:
    names = [site.name for site in _SITES]
    assert len(names) == len(set(names))
    for site in guard_sites.SITES:
        assert site.selection in guard_sites.SELECTIONS, site.name
    for site in calibration_sites.SITES:
        assert site.selection in calibration_sites.SELECTIONS, site.name
    for site in leak_injection.SITES:
        assert site.selection in leak_injection.SELECTIONS, site.name


@pytest.mark.parametrize("site", leak_injection.SITES, ids=[site.name for site in leak_injection.SITES])
def test_every_leak_site_leaves_its_file_compiling(site: guard_sites.Site) -> None:
    """A leak site's replacement is code of its own (a hook it installs): one that does not
    compile would fail every test of its selection and count as KILLED for nothing."""
    text = (ROOT / site.path).read_text().replace(site.snippet, site.replacement)
    compile(text, site.path, "exec")
