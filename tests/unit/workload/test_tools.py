import pytest

from kvscope.workload.tools import (
    calculate,
    extract_expression,
    format_hits,
    format_number,
    keywords,
    lookup,
)


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("(2418.6 - 2105.3) / 2105.3 * 100", (2418.6 - 2105.3) / 2105.3 * 100),
        ("2 ** 10", 1024.0),
        ("-3 + +2", -1.0),
        ("1,284.6 + 0.4", 1285.0),
        ("  (1 + 2) * (3 - 4) ", -3.0),
        ("7 / 2", 3.5),
    ],
)
def test_calculator_evaluates_arithmetic(expression: str, value: float) -> None:
    result = calculate(expression)
    assert result.error is None
    assert result.value == pytest.approx(value)


@pytest.mark.parametrize(
    ("expression", "fragment"),
    [
        ("", "no expression"),
        ("1 / 0", "division by zero"),
        ("__import__('os').system('true')", "unsupported"),
        ("a + 1", "unsupported"),
        ("True + 1", "unsupported constant"),
        ("'a' * 3", "unsupported constant"),
        ("2 ** 1000", "exponent"),
        ("1e308 * 10", "not finite"),
        ("(-8) ** 0.5", "complex"),
        ("7 % 2", "unsupported"),
        ("1 < 2", "unsupported"),
        ("1 +", "not an arithmetic expression"),
        ("1" + " + 1" * 100, "longer than"),
    ],
)
def test_calculator_errors_are_results(expression: str, fragment: str) -> None:
    result = calculate(expression)
    assert result.value is None
    assert result.error is not None and fragment in result.error
    assert result.text.startswith("calculator error:")


def test_calculator_text_and_number_format() -> None:
    assert calculate("1 / 8").text == "calculator: 0.125"
    assert format_number(14.881666) == "14.8817"
    assert format_number(2.0) == "2"
    assert format_number(-0.00001) == "0"


def test_extract_expression_takes_the_last_calc_line_only() -> None:
    plan = "CALC: (1 + 2) / 3\n1. then CALC: 212.4 / 2418.6 * 100\n2. report it"
    assert extract_expression(plan) == "212.4 / 2418.6 * 100"
    assert extract_expression("calc: 5 * 2\n3. next") == "5 * 2"
    assert extract_expression("no formula here") == ""
    assert extract_expression(None) == ""


DOCS = [
    (
        "acme",
        "Acme Corp | Annual report 2023\n"
        "Revenue was 120.0 in 2023 (2022: 100.0).\n"
        "Operating income was 12.0.\n"
        "\n"
        "Employee count | 2023 | 950",
    ),
    ("beta", "Beta Inc revenue title line\nBeta revenue grew to 55.0 in 2023."),
]


def test_keywords_drop_stopwords_short_words_and_duplicates() -> None:
    assert keywords("What was Acme's revenue growth in 2023, and revenue in 2022?") == (
        "acme",
        "revenue",
        "growth",
        "2023",
        "2022",
    )


def test_lookup_returns_best_lines_in_document_order() -> None:
    hits = lookup("What was Acme's revenue in 2023 and 2022?", DOCS, max_lines=2)
    assert [(h.document_id, h.line) for h in hits] == [
        ("acme", "Revenue was 120.0 in 2023 (2022: 100.0)."),
        ("beta", "Beta revenue grew to 55.0 in 2023."),
    ]
    # revenue: 2 lines, 2023: 3 lines (a year weighs half), 2022: 1 line
    assert hits[0].score == pytest.approx(1 / 2 + 0.5 / 3 + 0.5 / 1, abs=1e-4)
    assert hits[0].score > hits[1].score


def test_lookup_skips_titles_and_reports_no_match() -> None:
    assert lookup("Acme annual report", DOCS) == ()
    assert format_hits(()) == "lookup: no matching lines"
    text = format_hits(lookup("revenue 2023", DOCS), max_chars=30)
    assert len(text) == 30 and text.endswith("...")


def test_lookup_matches_plural_keywords() -> None:
    hits = lookup("How many employees?", DOCS)
    assert [h.line for h in hits] == ["Employee count | 2023 | 950"]
