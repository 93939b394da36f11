"""An app's own pip packages in its image: bare names pinned to what runs here."""

from __future__ import annotations

from importlib import metadata

from synth_deploy.modal import ImageRecipe, ModalSettings


def test_bare_names_are_pinned_and_specifiers_kept(tmp_path):
    settings = ModalSettings(pip_packages=["crafter", "numpy>=1.20", "no-such-dist-here-xyz"])
    recipe = ImageRecipe.for_app(tmp_path, settings)
    assert recipe.pip_packages[-3:] == (f"crafter=={metadata.version('crafter')}",
                                        "numpy>=1.20", "no-such-dist-here-xyz")
    listed = recipe.to_dict()
    assert listed["dependency_count"] == len(listed["dependencies"])
    assert {"crafter", "numpy", "pillow", "fastapi"} <= set(listed["dependencies"])
