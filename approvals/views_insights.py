"""The insights page (``/insights/``): approvals per tool and per operator over a
period, as tables and as bar charts drawn here as SVG (no script, no CDN).

Operators and admins only: a viewer reads the journal, not how people decide (403).
The figures and what each counts are in ``approvals/insights.py``; the page makes a
fixed number of queries whatever the number of rows (tests/test_insights.py).
"""

from __future__ import annotations

from datetime import datetime, time, timedelta

from django import forms
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_GET

from approvals.decisions import can_decide
from approvals.insights import Period, insights
from approvals.views import base_context

PRESETS = (7, 30, 90)
DEFAULT_DAYS = 30
# A chosen period longer than this is refused: the figures scan the period's rows.
MAX_DAYS = 366

# The charts' geometry, in the SVG's own units (the viewBox scales it to the screen).
CHART_WIDTH = 320
BAR_MAX = 250
ROW_HEIGHT = 34


class PeriodForm(forms.Form):
    """Either a preset (the last 7, 30 or 90 days) or both dates, inclusive."""

    days = forms.TypedChoiceField(
        choices=[(str(d), f"Last {d} days") for d in PRESETS],
        coerce=int,
        required=False,
        label="Period",
    )
    start = forms.DateField(required=False, label="From", widget=forms.DateInput({"type": "date"}))
    end = forms.DateField(required=False, label="To", widget=forms.DateInput({"type": "date"}))

    def clean(self):
        data = super().clean()
        start, end = data.get("start"), data.get("end")
        if (start is None) != (end is None):
            raise forms.ValidationError("Give both dates, or neither.")
        if start and end:
            if start > end:
                raise forms.ValidationError("The period must start before it ends.")
            if (end - start).days >= MAX_DAYS:
                raise forms.ValidationError(f"At most {MAX_DAYS} days.")
        return data

    def period(self, now: datetime) -> Period:
        """The chosen period; dates are whole days in the console's time zone."""
        data = self.cleaned_data
        if data.get("start"):
            zone = timezone.get_current_timezone()
            since = datetime.combine(data["start"], time.min, tzinfo=zone)
            until = datetime.combine(data["end"] + timedelta(days=1), time.min, tzinfo=zone)
            return Period(since, until)
        return Period(now - timedelta(days=data.get("days") or DEFAULT_DAYS), now)


def duration_text(value: timedelta | None) -> str:
    if value is None:
        return "—"
    seconds = value.total_seconds()
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172_800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def chart(title: str, rows: list[dict], key: str, text=str) -> dict:
    """One horizontal bar per row, longest for the largest value; rows without a
    value (no decision yet) are left out."""
    shown = [row for row in rows if row[key]]
    values = [
        row[key].total_seconds() if hasattr(row[key], "total_seconds") else row[key]
        for row in shown
    ]
    top = max(values, default=0) or 1
    bars = [
        {
            "label": row["name"],
            "text": text(row[key]),
            "y": i * ROW_HEIGHT,
            "width": max(1, round(BAR_MAX * value / top)),
        }
        for i, (row, value) in enumerate(zip(shown, values, strict=True))
    ]
    return {
        "title": title,
        "bars": bars,
        "width": CHART_WIDTH,
        "height": max(ROW_HEIGHT, len(bars) * ROW_HEIGHT),
    }


def percent(value: float | None) -> str:
    return "—" if value is None else f"{value:.0%}"


@login_required
@require_GET
def insights_page(request: HttpRequest) -> HttpResponse:
    if not can_decide(request.user):
        raise PermissionDenied("The insights are for operators and admins.")
    form = PeriodForm(request.GET or {"days": str(DEFAULT_DAYS)})
    now = timezone.now()
    valid = form.is_valid()
    period = form.period(now) if valid else Period(now - timedelta(days=DEFAULT_DAYS), now)
    figures = insights(period)
    for row in figures["tools"] + figures["operators"]:
        row["rate_text"] = percent(row["rate"])
        row["median_text"] = duration_text(row["median"])
        row["p90_text"] = duration_text(row["p90"])
    tools, operators = figures["tools"], figures["operators"]
    charts = [
        chart("Approvals asked, per tool", tools, "asked"),
        chart("Duplicates prevented, per tool", tools, "duplicates"),
        chart("Decisions, per operator", operators, "decided"),
        chart("Median time to decide, per operator", operators, "median", duration_text),
    ]
    context = base_context(
        request,
        period_form=form,
        period=period,
        shown_until=period.until - timedelta(microseconds=1),
        tools=tools,
        operators=operators,
        charts=charts,
    )
    return render(request, "approvals/insights.html", context, status=200 if valid else 400)
