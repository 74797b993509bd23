"""The public API listed in ``sglang_patcher.__all__`` is complete and importable."""

import inspect

import sglang_patcher
from sglang_patcher import errors


def test_every_listed_name_exists():
    missing = [n for n in sglang_patcher.__all__ if not hasattr(sglang_patcher, n)]
    assert not missing


def test_every_error_class_is_public_and_has_an_exit_code():
    classes = [c for _, c in inspect.getmembers(errors, inspect.isclass)
               if issubclass(c, errors.SglpatchError)]
    assert classes
    for cls in classes:
        assert cls.__name__ in sglang_patcher.__all__, cls.__name__
        assert isinstance(cls.exit_code, int) and cls.exit_code >= 1


def test_exit_codes_match_the_readme_table():
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    for cls in (errors.ConfigError, errors.PatchsetError, errors.ApplyError, errors.TransportError,
                errors.DiscoveryError, errors.DriftError, errors.DeployError,
                errors.CheckFailedError, errors.StateError):
        assert f"| {cls.exit_code} |" in readme, cls.__name__
