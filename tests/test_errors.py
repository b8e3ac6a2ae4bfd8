import pytest

from gpext import errors


@pytest.mark.parametrize(
    "cls, builtin",
    [
        (errors.InputDataError, ValueError),
        (errors.ShapeError, ValueError),
        (errors.InputTypeError, TypeError),
        (errors.DatasetNotFoundError, FileNotFoundError),
        (errors.DataFormatError, ValueError),
        (errors.NumericalError, RuntimeError),
        (errors.NotFittedError, RuntimeError),
        (errors.MissingExtraError, ImportError),
    ],
)
def test_errors_subclass_base_and_builtin(cls, builtin):
    assert issubclass(cls, errors.GpextError)
    assert issubclass(cls, builtin)
    with pytest.raises(builtin):
        raise cls("x")


def test_warnings_hierarchy():
    assert issubclass(errors.NumericalWarning, errors.GpextWarning)
    assert issubclass(errors.NumericalWarning, RuntimeWarning)
    assert issubclass(errors.DataWarning, UserWarning)


def test_expected_got_format():
    msg = errors.expected_got("f.x", "a positive number", -1, "Pass x > 0.")
    assert msg == "f.x: expected a positive number, got -1. Pass x > 0."
    assert errors.expected_got("a", "b", "c") == "a: expected b, got c."
