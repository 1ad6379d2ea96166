"""The documentation site's generated pages (scripts/docs_hooks.py; CI builds the site with mkdocs --strict)."""

import tilewise
from conftest import load_script


def test_docs_site_has_a_page_for_every_op_family():
    """scripts/docs_hooks.py (the mkdocs site's generated pages): every package under tilewise/ops is a
    family page, every module it cites imports and has a docstring, every public name is in the API page."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    hooks = load_script("docs_hooks")
    families = {p.name for p in (root / "src" / "tilewise" / "ops").iterdir()
                if p.is_dir() and (p / "__init__.py").exists()}
    assert families == set(hooks.FAMILIES)
    for family, (_, modules, _) in hooks.FAMILIES.items():
        for m in modules:
            assert hooks._module_doc(m), m
    api = hooks.api_page()
    for module, names in tilewise._PUBLIC.items():
        for name in names:
            assert f"::: tilewise.{module}.{name}\n" in api
