"""A failed row shows its error's first line beside the class; the error-class filter offers the classes present."""

from __future__ import annotations

from inspector.tables import PREVIEW_CHARS, error_line
from threadmill.outcome import error_of


class QuotaExceeded(Exception):
    pass


def raised(exception: BaseException) -> BaseException:
    try:
        raise exception
    except BaseException as e:  # noqa: BLE001 - the test wants the exception object, raised for its traceback
        return e


def test_the_error_line_is_the_first_line_of_the_message():
    assert error_line(error_of(raised(ValueError("bad row 7\nsecond line\nthird")))) == "bad row 7"


def test_the_error_line_of_a_chained_error_is_the_last_raised_one():
    try:
        try:
            raise KeyError("inner")
        except KeyError as e:
            raise QuotaExceeded("quota of 100 reached") from e
    except QuotaExceeded as e:
        assert error_line(error_of(e)) == "quota of 100 reached"


def test_a_long_error_line_is_cut():
    line = error_line(error_of(raised(RuntimeError("x" * 500))))
    assert line == "x" * PREVIEW_CHARS + "…"


def test_an_error_without_a_message_has_an_empty_line():
    assert error_line(error_of(raised(ConnectionError()))) == ""


def test_a_failed_segment_shows_the_escaped_error_line_and_offers_its_error_classes(operator_client, seeded):
    html = operator_client.get("/threadmill/default/default/failed/").content.decode()
    assert (
        '<span class="mono">builtins.RuntimeError</span> <span class="error-line">boom &lt;b&gt;bold&lt;/b&gt;</span>'
        in html
    )
    assert '<datalist id="error-classes"><option value="builtins.RuntimeError"></datalist>' in html
    assert 'list="error-classes"' in html
