"""The error tree: stable, unique codes and the BP-46 response classes."""

import pytest

from appliance import errors


def test_codes_are_unique_and_round_trip():
    table = errors.all_errors()
    assert len(table) == len(set(table))
    for code, cls in table.items():
        exc = errors.error_for_code(code, "detail")
        assert type(exc) is cls
        assert exc.code == code
        assert str(exc) == "detail"


def test_contract_names_exist_with_stable_codes():
    assert errors.LedgerFencedError.code == 4
    assert errors.NoSuchLedgerError.code == 2
    assert errors.NoSuchEntryError.code == 3
    assert errors.UnauthorizedError.code == 7
    for name in ("LedgerClosedError", "NotEnoughBookiesError", "MetadataVersionError",
                 "DigestMismatchError", "DataUnknownError", "BKTimeoutError"):
        assert issubclass(getattr(errors, name), errors.BKError)


def test_response_classes():
    assert errors.is_explicit_negative(errors.NoSuchEntryError.code)
    assert errors.is_explicit_negative(errors.NoSuchLedgerError.code)
    assert not errors.is_explicit_negative(errors.DataUnknownError.code)
    assert not errors.is_explicit_negative(errors.BKTimeoutError.code)
    assert errors.is_retryable(errors.BKTimeoutError.code)
    assert not errors.is_retryable(errors.UnauthorizedError.code)
    assert not errors.is_retryable(errors.OK)


def test_unknown_code_maps_to_root_and_ok_is_not_an_error():
    assert type(errors.error_for_code(9999)) is errors.BKError
    with pytest.raises(ValueError):
        errors.error_for_code(errors.OK)


def test_default_message_is_docstring():
    assert "fenced" in str(errors.LedgerFencedError())
