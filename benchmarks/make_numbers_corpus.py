"""Seeded numbers-and-tables perplexity corpus: held-out --seed 1101, calibration --seed 2202 --min-chars 8000."""
# The committed files are exactly this script's output:
#   python benchmarks/make_numbers_corpus.py --seed 1101 --out jido/utils/corpora/heldout/numbers_tables.txt
#   python benchmarks/make_numbers_corpus.py --seed 2202 --min-chars 8000 \
#       --out jido/utils/corpora/calibration/numbers_tables.txt
# Standard library only; every value comes from random.Random(seed), so the text never depends on the clock, the
# machine or the hash seed. Figures are internally consistent: row and column totals add up, percentage shares
# sum to 100.0, invoice totals equal their lines plus tax, timetable times follow the distances.
from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
from datetime import date, datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

REGIONS = ["North", "South", "East", "West", "Central", "Northeast", "Southwest", "Pacific", "Mountain",
           "Atlantic", "Gulf Coast", "Great Lakes", "Midlands", "Highlands", "Coastal"]
PRODUCT_LINES = ["office furniture", "garden tools", "kitchen appliances", "bicycle parts", "outdoor apparel",
                 "printer supplies", "pet food", "solar panels", "hand tools", "lighting fixtures"]
TEAMS = ["Riverside Rovers", "Harbour City", "Oakfield United", "Northgate Athletic", "Millbrook Town",
         "Eastwood Wanderers", "Kingsport FC", "Ashford Albion", "Stonebridge Rangers", "Westvale Borough",
         "Redcliffe County", "Lakeside Dynamo", "Pinehurst Celtic", "Fairhaven Villa", "Brockley Park",
         "Southmoor Rovers"]
STATIONS = ["Central", "Park Road", "Elm Street", "Millfield", "Church Lane", "Kingsbury", "Ashworth",
            "Brook Green", "Hillside", "Marsh Lane", "Orchard Way", "Castle Hill", "Newbridge", "Fenwick",
            "Lower Dale", "Summerfield", "Westport", "Hollins Cross", "Greyfriars", "Abbey Mead"]
LINES = ["Coastal Line", "Valley Line", "Northern Loop", "Airport Express", "Riverside Branch", "Cross-County Line"]
CITIES = [("Oslo", -4.0, 22.0), ("Lisbon", 8.0, 28.0), ("Denver", -8.0, 31.0), ("Melbourne", 7.0, 26.0),
          ("Toronto", -10.0, 27.0), ("Madrid", 2.0, 33.0), ("Seattle", 2.0, 25.0), ("Prague", -4.0, 25.0),
          ("Osaka", 2.0, 32.0), ("Edinburgh", 1.0, 19.0), ("Phoenix", 6.0, 41.0), ("Cape Town", 8.0, 27.0)]
COMPANIES = ["Northwind Traders", "Bluebell Catering Ltd", "Apex Engineering GmbH", "Larkspur Dental Group",
             "Cobalt Logistics Inc.", "Meridian Books", "Fernhill Veterinary Clinic", "Granite Peak Outfitters",
             "Silverline Print Co.", "Harbourview Hotel"]
ITEMS = [("A4 copy paper, box of 5 reams", 2450), ("Toner cartridge, black", 6899), ("Ergonomic office chair", 18900),
         ("USB-C docking station", 12999), ("Stainless steel shelving unit", 8475), ("LED panel light 600x600", 3420),
         ("Network switch, 24-port", 21500), ("Whiteboard markers, pack of 12", 1195), ("Standing desk frame", 32900),
         ("Cat6 patch cable, 3 m", 450), ("Label printer tape, 12 mm", 1575), ("Consulting hours", 9500),
         ("Barcode scanner", 7650),
         ("Thermal receipt rolls, case of 50", 3990), ("Wireless keyboard and mouse", 4599), ("Monitor arm", 6250)]
SERVICES = [("Consulting hours", 9500), ("On-site installation", 14000), ("Annual support plan", 48000),
            ("Data recovery, per drive", 22500), ("Remote support, per hour", 7200)]
TICKERS = ["NWTR", "HLXG", "BRMD", "QSPN", "TALO", "VRDN", "KESM", "OPLX"]
SURVEY_QUESTIONS = [
    ("How do you usually commute to work?", ["Car", "Bus", "Train", "Bicycle", "Walking", "Work from home"]),
    ("How satisfied are you with the new billing portal?",
     ["Very satisfied", "Satisfied", "Neutral", "Dissatisfied", "Very dissatisfied"]),
    ("Which operating system do you use most?", ["Windows", "macOS", "Linux", "ChromeOS", "Other"]),
    ("How many hours of sleep do you get on a weeknight?",
     ["Less than 5", "5 to 6", "6 to 7", "7 to 8", "More than 8"]),
    ("Preferred contact method", ["Email", "Phone", "Text message", "Post", "No preference"]),
]
DEPARTMENTS = ["Engineering", "Marketing", "Sales", "Operations", "Finance", "Human Resources", "Customer Support",
               "Research", "Facilities", "Legal"]
TASKS = ["code review", "sprint planning", "client call", "bug triage", "documentation", "deployment",
         "design meeting", "data migration", "testing", "training session", "budget review", "site visit"]
AIRPORTS = {"LHR": (51.4700, -0.4543), "CDG": (49.0097, 2.5479), "AMS": (52.3105, 4.7683),
            "FRA": (50.0379, 8.5622), "MAD": (40.4983, -3.5676), "DUB": (53.4264, -6.2499),
            "CPH": (55.6180, 12.6508), "ZRH": (47.4582, 8.5555), "VIE": (48.1103, 16.5697),
            "OSL": (60.1976, 11.1004), "LIS": (38.7742, -9.1342), "BCN": (41.2974, 2.0833)}
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December"]


def money(cents: int, symbol: str = "$") -> str:
    sign = "-" if cents < 0 else ""
    cents = abs(cents)
    return f"{sign}{symbol}{cents // 100:,}.{cents % 100:02d}"


def shares(values: list[int], decimals: int = 1) -> list[str]:
    """Percentages of values, rounded by largest remainder so that they sum to exactly 100."""
    total = sum(values)
    scale = 10 ** decimals
    raw = [v * 100 * scale / total for v in values]
    floors = [math.floor(r) for r in raw]
    short = 100 * scale - sum(floors)
    order = sorted(range(len(values)), key=lambda i: (raw[i] - floors[i], -i), reverse=True)
    for i in order[:short]:
        floors[i] += 1
    return [f"{f / scale:.{decimals}f}" for f in floors]


def table(header: list[str], rows: list[list[str]], align: list[str] | None = None) -> str:
    align = align or ["l"] + ["r"] * (len(header) - 1)
    rule = ["---:" if a == "r" else ":---" for a in align]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(rule) + " |"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def random_date(rng: random.Random, first: int = 2016, last: int = 2024) -> date:
    return date(rng.randint(first, last), rng.randint(1, 12), rng.randint(1, 28))


def great_circle_km(a: tuple[float, float], b: tuple[float, float]) -> int:
    (lat1, lon1), (lat2, lon2) = (map(math.radians, a)), (map(math.radians, b))
    h = math.sin((lat2 - lat1) / 2) ** 2 + math.cos(lat1) * math.cos(lat2) * math.sin((lon2 - lon1) / 2) ** 2
    return round(2 * 6371.0 * math.asin(math.sqrt(h)))


def hm(minutes: int) -> str:
    return f"{minutes // 60:02d}:{minutes % 60:02d}"


def duration(minutes: int) -> str:
    h, m = divmod(minutes, 60)
    return f"{h} h {m:02d} min" if h else f"{m} min"


def quarterly_sales(rng: random.Random) -> str:
    regions = rng.sample(REGIONS, rng.randint(4, 6))
    year = rng.randint(2017, 2024)
    product = rng.choice(PRODUCT_LINES)
    trend = [1.0, rng.uniform(0.95, 1.12), rng.uniform(0.95, 1.18), rng.uniform(1.0, 1.3)]
    data = []
    for _ in regions:
        base = rng.randint(600, 4800)
        data.append([round(base * t * rng.uniform(0.9, 1.1)) for t in trend])
    totals = [sum(q) for q in data]
    pct = shares(totals)
    rows = [[r, *(f"{v:,}" for v in q), f"{t:,}", f"{p}%"] for r, q, t, p in zip(regions, data, totals, pct)]
    col = [sum(q[i] for q in data) for i in range(4)]
    grand = sum(col)
    rows.append(["**Total**", *(f"**{v:,}**" for v in col), f"**{grand:,}**", "**100.0%**"])
    top = max(range(len(regions)), key=lambda i: totals[i])
    growth = (col[3] - col[0]) / col[0] * 100
    return (f"### {year} sales of {product} by region\n\n"
            f"All figures are in thousands of US dollars (USD k).\n\n"
            + table(["Region", "Q1", "Q2", "Q3", "Q4", "Total", "Share"], rows) +
            f"\n\n{regions[top]} contributed {pct[top]}% of the {year} total of ${grand:,}k. "
            f"Company-wide revenue moved {growth:+.1f}% from Q1 (${col[0]:,}k) to Q4 (${col[3]:,}k), and the "
            f"average quarter came to ${grand / 4:,.1f}k.\n")


def league_standings(rng: random.Random) -> str:
    teams = rng.sample(TEAMS, rng.choice([6, 8]))
    stats = {t: [0, 0, 0, 0, 0, 0] for t in teams}  # P W D L GF GA
    goals_w = [30, 34, 21, 10, 4, 1]
    matches = 0
    total_goals = 0
    for home in teams:
        for away in teams:
            if home == away:
                continue
            hg = rng.choices(range(6), weights=goals_w)[0] + (1 if rng.random() < 0.15 else 0)
            ag = rng.choices(range(6), weights=goals_w)[0]
            matches += 1
            total_goals += hg + ag
            for t, gf, ga in ((home, hg, ag), (away, ag, hg)):
                s = stats[t]
                s[0] += 1
                s[4] += gf
                s[5] += ga
                if gf > ga:
                    s[1] += 1
                elif gf == ga:
                    s[2] += 1
                else:
                    s[3] += 1
    order = sorted(teams, key=lambda t: (-(3 * stats[t][1] + stats[t][2]), -(stats[t][4] - stats[t][5]),
                                         -stats[t][4], t))
    rows = []
    for pos, t in enumerate(order, 1):
        p, w, d, l, gf, ga = stats[t]
        gd = gf - ga
        rows.append([str(pos), t, str(p), str(w), str(d), str(l), str(gf), str(ga),
                     f"{gd:+d}" if gd else "0", str(3 * w + d)])
    season = rng.randint(2015, 2023)
    pts = [3 * stats[t][1] + stats[t][2] for t in order]
    gap = pts[0] - pts[1]
    if gap:
        lead = f"{order[0]} finished {gap} point{'s' if gap != 1 else ''} clear of {order[1]}."
    else:
        a, b = stats[order[0]], stats[order[1]]
        why = ("goal difference" if a[4] - a[5] != b[4] - b[5] else "goals scored" if a[4] != b[4]
               else "the tiebreakers")
        lead = f"{order[0]} and {order[1]} finished level on {pts[0]} points; {order[0]} took the title on {why}."
    return (f"### Final standings, {season}/{str(season + 1)[2:]} regional league\n\n"
            + table(["Pos", "Team", "P", "W", "D", "L", "GF", "GA", "GD", "Pts"], rows,
                    ["r", "l"] + ["r"] * 8) +
            f"\n\n{lead} The {matches} matches produced {total_goals} goals, an average of "
            f"{total_goals / matches:.2f} per match. Three points for a win, one for a draw.\n")


def train_timetable(rng: random.Random) -> str:
    line = rng.choice(LINES)
    stops = rng.sample(STATIONS, rng.randint(6, 9))
    km = [0.0]
    for _ in stops[1:]:
        km.append(round(km[-1] + rng.uniform(3.0, 18.0), 1))
    speed = rng.choice([60, 70, 80, 90])
    express_stops = {0, len(stops) - 1} | set(rng.sample(range(1, len(stops) - 1), 2))
    first = rng.randint(5 * 60 + 30, 7 * 60)
    headway = rng.choice([20, 30, 40, 60])
    services = []
    for k in range(rng.randint(4, 6)):
        express = k % 3 == 1
        t = first + k * headway
        times = []
        for i in range(len(stops)):
            if i > 0:
                run = (km[i] - km[i - 1]) / (speed * (1.15 if express else 1.0)) * 60
                t += max(2, round(run))
            if express and i not in express_stops:
                times.append("—")
            else:
                times.append(hm(t))
                if 0 < i < len(stops) - 1:
                    t += 1  # dwell
        services.append((f"{rng.randint(1, 9)}{k:01d}{rng.randint(10, 99)}", express, times))
    header = ["Station", "km"] + [f"{num}{' (fast)' if ex else ''}" for num, ex, _ in services]
    rows = [[s, f"{d:.1f}"] + [svc[2][i] for svc in services] for i, (s, d) in enumerate(zip(stops, km))]

    def mins(s: str) -> int:
        return int(s[:2]) * 60 + int(s[3:])

    slow = next(s for s in services if not s[1])
    fast = next((s for s in services if s[1]), None)
    slow_time = mins(slow[2][-1]) - mins(slow[2][0])
    text = (f"### {line}: weekday morning departures from {stops[0]}\n\n"
            + table(header, rows, ["l"] + ["r"] * (len(header) - 1)) +
            f"\n\nA dash means the train passes without stopping. Stopping services cover the {km[-1]:.1f} km to "
            f"{stops[-1]} in {duration(slow_time)}, an average of {km[-1] / slow_time * 60:.1f} km/h")
    if fast:
        fast_time = mins(fast[2][-1]) - mins(fast[2][0])
        text += f"; fast services take {duration(fast_time)}, saving {slow_time - fast_time} min"
    return text + f". Trains leave every {headway} minutes.\n"


def weather(rng: random.Random) -> str:
    city, lo, hi = rng.choice(CITIES)
    month = rng.randint(1, 12)
    year = rng.randint(2016, 2024)
    start = date(year, month, rng.randint(1, 18))
    # seasonal mean: warmest in July north of the equator, January south of it
    south = city in ("Melbourne", "Cape Town")
    phase = math.cos((month - (1 if south else 7)) / 12 * 2 * math.pi)
    mean = (lo + hi) / 2 + (hi - lo) / 2 * phase * 0.8
    rows = []
    tmins, tmaxs, rain = [], [], []
    for d in range(rng.randint(7, 10)):
        day = start + timedelta(days=d)
        tmean = mean + rng.uniform(-3.5, 3.5)
        spread = rng.uniform(5.0, 12.0)
        tmin, tmax = round(tmean - spread / 2, 1), round(tmean + spread / 2, 1)
        mm = 0.0 if rng.random() < 0.55 else round(rng.expovariate(1 / 6.0), 1)
        hum = rng.randint(35, 70) + (15 if mm > 0 else 0)
        wind = rng.randint(4, 38)
        tmins.append(tmin)
        tmaxs.append(tmax)
        rain.append(mm)
        rows.append([day.strftime("%a %d %b"), f"{tmin:.1f}", f"{tmax:.1f}", f"{(tmin + tmax) / 2:.1f}",
                     f"{mm:.1f}", f"{hum}", f"{wind}"])
    wet = sum(1 for r in rain if r > 0)
    warmest = max(range(len(rows)), key=lambda i: tmaxs[i])
    return (f"### Daily observations, {city}, {MONTHS[month - 1]} {year}\n\n"
            + table(["Date", "Min °C", "Max °C", "Mean °C", "Rain mm", "RH %", "Wind km/h"], rows) +
            f"\n\nOver these {len(rows)} days the mean maximum was {statistics.fmean(tmaxs):.1f} °C and the mean "
            f"minimum {statistics.fmean(tmins):.1f} °C. Total rainfall was {sum(rain):.1f} mm on {wet} wet "
            f"day{'s' if wet != 1 else ''}; the warmest afternoon was {rows[warmest][0]} at {tmaxs[warmest]:.1f} °C "
            f"({tmaxs[warmest] * 9 / 5 + 32:.1f} °F).\n")


def csv_block(rng: random.Random) -> str:
    kind = rng.randrange(3)
    if kind == 0:
        t = datetime(rng.randint(2019, 2024), rng.randint(1, 12), rng.randint(1, 28), rng.randint(0, 20), 0)
        sensor = f"env-{rng.randint(1, 40):02d}"
        temp, hum, pres = rng.uniform(15, 28), rng.uniform(30, 65), rng.uniform(995, 1030)
        lines = ["timestamp,sensor_id,temperature_c,humidity_pct,pressure_hpa,battery_v"]
        batt = rng.uniform(3.6, 4.1)
        step = rng.choice([5, 10, 15])
        for _ in range(rng.randint(8, 12)):
            temp += rng.uniform(-0.4, 0.5)
            hum = min(99.0, max(5.0, hum + rng.uniform(-1.5, 1.5)))
            pres += rng.uniform(-0.6, 0.6)
            batt -= rng.uniform(0.0, 0.004)
            lines.append(f"{t.isoformat()}Z,{sensor},{temp:.2f},{hum:.1f},{pres:.1f},{batt:.3f}")
            t += timedelta(minutes=step)
        intro = f"Raw export from sensor {sensor}, one reading every {step} minutes:"
        outro = f"The file holds {len(lines) - 1} rows; timestamps are UTC."
    elif kind == 1:
        items = rng.sample(ITEMS, rng.randint(6, 9))
        lines = ["sku,description,qty_on_hand,unit_cost,stock_value"]
        total = 0
        for name, cents in items:
            qty = rng.randint(0, 240)
            value = qty * cents
            total += value
            desc = f'"{name}"' if "," in name else name
            lines.append(f"{rng.choice('ABCDKMT')}{rng.randint(1000, 9999)}-{rng.randint(10, 99)},{desc},{qty},"
                         f"{cents / 100:.2f},{value / 100:.2f}")
        intro = f"Stock count exported on {random_date(rng).isoformat()} (warehouse {rng.randint(1, 12)}):"
        outro = f"Total stock value: {money(total)} across {len(items)} SKUs."
    else:
        airports = rng.sample(sorted(AIRPORTS), 6)
        carrier = rng.choice(["XA", "QL", "VN", "ZT"])
        lines = ["flight,origin,destination,departure_utc,arrival_utc,block_minutes,distance_km"]
        total_min = 0
        for _ in range(rng.randint(6, 9)):
            o, d = rng.sample(airports, 2)
            dist = great_circle_km(AIRPORTS[o], AIRPORTS[d])
            block = round(dist / 780 * 60) + rng.randint(20, 35)
            dep = rng.randint(6 * 60, 21 * 60) // 5 * 5
            total_min += block
            lines.append(f"{carrier}{rng.randint(100, 1999)},{o},{d},{hm(dep)},{hm((dep + block) % 1440)},"
                         f"{block},{dist}")
        intro = "Scheduled sectors for the day, times in UTC:"
        outro = f"Scheduled block time totals {total_min} minutes ({duration(total_min)})."
    return intro + "\n\n```csv\n" + "\n".join(lines) + "\n```\n\n" + outro + "\n"


def invoice(rng: random.Random) -> str:
    issued = random_date(rng, 2019, 2024)
    terms = rng.choice([14, 30, 45])
    lines = []
    subtotal = 0
    for name, cents in rng.sample(ITEMS + SERVICES, rng.randint(3, 6)):
        qty = rng.choice([1, 1, 2, 3, 4, 5, 6, 10, 12, 20, 25])
        amount = qty * cents
        subtotal += amount
        lines.append([name, str(qty), money(cents), money(amount)])
    discount = 0
    if rng.random() < 0.4:
        disc_pct = rng.choice([5, 10, 15])
        discount = int((Decimal(subtotal) * disc_pct / 100).quantize(Decimal(1), ROUND_HALF_UP))
    rate = Decimal(rng.choice(["5", "6.5", "7.25", "8", "8.875", "10", "20"]))
    taxable = subtotal - discount
    tax = int((Decimal(taxable) * rate / 100).quantize(Decimal(1), ROUND_HALF_UP))
    shipping = rng.choice([0, 0, 995, 1500, 2450])
    total = taxable + tax + shipping
    rows = lines + [["", "", "Subtotal", money(subtotal)]]
    if discount:
        rows.append(["", "", f"Discount ({disc_pct}%)", money(-discount)])
    rows += [["", "", f"Sales tax ({rate}%)", money(tax)], ["", "", "Shipping", money(shipping)],
             ["", "", "**Total due**", f"**{money(total)}**"]]
    number = f"INV-{issued.year}-{rng.randint(1, 99999):05d}"
    return (f"### Invoice {number}\n\n"
            f"Billed to: {rng.choice(COMPANIES)}, account {rng.randint(100000, 999999)}\n"
            f"Issue date: {issued.isoformat()}  |  Due date: {(issued + timedelta(days=terms)).isoformat()} "
            f"(net {terms})\n\n"
            + table(["Description", "Qty", "Unit price", "Amount"], rows, ["l", "r", "r", "r"]) +
            f"\n\nPlease pay {money(total)} by {(issued + timedelta(days=terms)).strftime('%d %B %Y')}. "
            f"Late payments accrue interest at 1.5% per month ({money(round(total * 0.015))} per month on this "
            f"balance).\n")


CONVERSIONS = [
    ("km", "mi", lambda x: x * 0.621371, 1, 250), ("mi", "km", lambda x: x * 1.609344, 1, 150),
    ("kg", "lb", lambda x: x * 2.204623, 0.5, 120), ("lb", "kg", lambda x: x * 0.453592, 1, 300),
    ("°C", "°F", lambda x: x * 9 / 5 + 32, -30, 45), ("°F", "°C", lambda x: (x - 32) * 5 / 9, -10, 110),
    ("L", "US gal", lambda x: x * 0.264172, 1, 200), ("m", "ft", lambda x: x * 3.280840, 0.5, 3000),
    ("in", "cm", lambda x: x * 2.54, 0.25, 96), ("km/h", "m/s", lambda x: x / 3.6, 5, 300),
    ("kWh", "MJ", lambda x: x * 3.6, 0.1, 500), ("psi", "kPa", lambda x: x * 6.894757, 10, 120),
    ("ha", "acres", lambda x: x * 2.471054, 0.2, 900), ("kn", "km/h", lambda x: x * 1.852, 2, 40),
    ("mL", "US fl oz", lambda x: x * 0.033814, 5, 1000), ("bar", "psi", lambda x: x * 14.503774, 0.5, 12),
]


def conversions(rng: random.Random) -> str:
    picks = rng.sample(CONVERSIONS, rng.randint(6, 9))
    lines = []
    for src, dst, f, lo, hi in picks:
        x = round(rng.uniform(lo, hi), rng.choice([0, 1, 2]))
        digits = 2 if abs(f(x)) < 100 else 1
        x_text = f"{x:g}" if x != int(x) else f"{int(x):,}"
        lines.append(f"- {x_text} {src} = {f(x):,.{digits}f} {dst}")
    return "### Unit conversions\n\n" + "\n".join(lines) + "\n"


def lab_measurements(rng: random.Random) -> str:
    if rng.random() < 0.5:
        length = rng.uniform(0.4, 1.6)
        rows, gs = [], []
        for trial in range(1, rng.randint(6, 8) + 1):
            L = round(length + rng.uniform(-0.002, 0.002), 3)
            T = round(2 * math.pi * math.sqrt(L / 9.80665) * rng.uniform(0.994, 1.006), 3)
            g = 4 * math.pi ** 2 * L / T ** 2
            gs.append(g)
            rows.append([str(trial), f"{L:.3f}", f"{T * 10:.2f}", f"{T:.3f}", f"{g:.3f}"])
        mean, sd = statistics.fmean(gs), statistics.stdev(gs)
        err = (mean - 9.80665) / 9.80665 * 100
        return ("### Pendulum experiment: estimating g\n\n"
                "Ten swings were timed for each trial and the period T = t10 / 10; g = 4π²L / T².\n\n"
                + table(["Trial", "L (m)", "t10 (s)", "T (s)", "g (m/s²)"], rows) +
                f"\n\nMean g = {mean:.3f} m/s² with a sample standard deviation of {sd:.3f} m/s² "
                f"(n = {len(gs)}, standard error {sd / math.sqrt(len(gs)):.4f} m/s²). The deviation from the "
                f"standard value 9.80665 m/s² is {err:+.2f}%.\n")
    material, rho = rng.choice([("aluminium", 2.70), ("brass", 8.50), ("copper", 8.96), ("granite", 2.75),
                                 ("oak", 0.75), ("PVC", 1.38), ("titanium", 4.51)])
    rows, dens = [], []
    for s in range(1, rng.randint(5, 7) + 1):
        vol = round(rng.uniform(4.0, 60.0), 2)
        mass = round(vol * rho * rng.uniform(0.985, 1.015), 2)
        dens.append(mass / vol)
        rows.append([f"S{s}", f"{mass:.2f}", f"{vol:.2f}", f"{mass / vol:.3f}"])
    mean, sd = statistics.fmean(dens), statistics.stdev(dens)
    return (f"### Density of {material} samples at 20.0 °C\n\n"
            + table(["Sample", "Mass (g)", "Volume (cm³)", "Density (g/cm³)"], rows) +
            f"\n\nMean density {mean:.3f} ± {sd:.3f} g/cm³ (1σ, n = {len(dens)}), i.e. "
            f"{mean * 1000:,.0f} kg/m³; the handbook value is {rho:.2f} g/cm³, a difference of "
            f"{(mean - rho) / rho * 100:+.2f}%.\n")


def science_lines(rng: random.Random) -> str:
    lam = rng.uniform(1.0, 9.0) * 10 ** -rng.randint(3, 6)
    half = math.log(2) / lam
    c0 = rng.randint(200, 5000)
    t = rng.randint(1, 5) * round(half / 2, -1 if half < 1000 else -2)
    conc = rng.uniform(0.05, 0.9)
    mw = rng.choice([(58.44, "NaCl"), (180.16, "glucose"), (74.55, "KCl"), (40.00, "NaOH"), (342.30, "sucrose")])
    vol_ml = rng.choice([100, 250, 500, 1000])
    grams = conc * mw[0] * vol_ml / 1000
    wavelength = rng.randint(380, 750)
    energy = 6.62607015e-34 * 2.99792458e8 / (wavelength * 1e-9)
    dist_au = rng.uniform(0.4, 30.0)
    return ("### Worked values\n\n"
            f"- A sample with decay constant λ = {lam:.3e} per year has a half-life of ln 2 / λ = {half:,.0f} years; "
            f"after {t:,.0f} years an initial {c0:,} Bq falls to {c0 * math.exp(-lam * t):,.1f} Bq.\n"
            f"- To make {vol_ml} mL of {conc:.3f} mol/L {mw[1]} (M = {mw[0]:.2f} g/mol), dissolve "
            f"{grams:.3f} g and make up to volume.\n"
            f"- A photon of wavelength {wavelength} nm carries E = hc/λ = {energy:.3e} J, or "
            f"{energy / 1.602176634e-19:.3f} eV.\n"
            f"- At {dist_au:.2f} AU ({dist_au * 1.495978707e8:,.0f} km) light takes {dist_au * 499.005:,.1f} s "
            f"({dist_au * 499.005 / 60:.2f} min) to arrive.\n")


def survey(rng: random.Random) -> str:
    question, options = rng.choice(SURVEY_QUESTIONS)
    n = rng.randint(180, 2600)
    weights = [rng.uniform(0.2, 3.0) for _ in options]
    counts = [int(n * w / sum(weights)) for w in weights]
    counts[max(range(len(counts)), key=lambda i: weights[i])] += n - sum(counts)
    pct = shares(counts)
    rows = [[o, f"{c:,}", f"{p}%"] for o, c, p in zip(options, counts, pct)]
    rows.append(["**All respondents**", f"**{n:,}**", "**100.0%**"])
    top = max(range(len(options)), key=lambda i: counts[i])
    moe = 1.96 * math.sqrt(0.25 / n) * 100
    when = random_date(rng, 2018, 2024)
    until = when + timedelta(days=rng.randint(5, 21))
    return (f"### Survey: \"{question}\"\n\n"
            f"Fieldwork {when.strftime('%d %b %Y')} to {until.strftime('%d %b %Y')}, "
            f"n = {n:,}.\n\n" + table(["Answer", "Responses", "Share"], rows) +
            f"\n\nThe most common answer was \"{options[top]}\" ({pct[top]}%). With n = {n:,} the margin of "
            f"error at 95% confidence is about ±{moe:.1f} percentage points.\n")


def stock_prices(rng: random.Random) -> str:
    ticker = rng.choice(TICKERS)
    day = random_date(rng, 2019, 2024)
    prev = round(rng.uniform(12, 380), 2)
    first_prev = prev
    rows = []
    vols = []
    while len(rows) < rng.randint(6, 9):
        if day.weekday() < 5:
            o = round(prev * (1 + rng.gauss(0, 0.006)), 2)
            c = round(o * (1 + rng.gauss(0, 0.015)), 2)
            h = round(max(o, c) * (1 + abs(rng.gauss(0, 0.006))), 2)
            low = round(min(o, c) * (1 - abs(rng.gauss(0, 0.006))), 2)
            v = rng.randint(300, 9000) * 1000
            vols.append(v)
            rows.append([day.isoformat(), f"{o:.2f}", f"{h:.2f}", f"{low:.2f}", f"{c:.2f}",
                         f"{(c - prev) / prev * 100:+.2f}%", f"{v:,}"])
            prev = c
        day += timedelta(days=1)
    return (f"### {ticker} daily prices (USD)\n\n"
            + table(["Date", "Open", "High", "Low", "Close", "Change", "Volume"], rows) +
            f"\n\nOver {len(rows)} sessions {ticker} moved from a prior close of {first_prev:.2f} to {prev:.2f} "
            f"({(prev - first_prev) / first_prev * 100:+.2f}%). Average daily volume was "
            f"{sum(vols) / len(vols):,.0f} shares; the busiest session traded {max(vols):,}.\n")


def timesheet(rng: random.Random) -> str:
    day = random_date(rng, 2020, 2024)
    while day.weekday() != 0:
        day += timedelta(days=1)
    name = rng.choice(["A. Okafor", "M. Lindqvist", "J. Tanaka", "R. Alvarez", "S. Novak", "P. Brennan"])
    rows = []
    total = 0
    for d in range(5):
        start = rng.choice([7 * 60 + 30, 8 * 60, 8 * 60 + 15, 8 * 60 + 30, 9 * 60])
        length = rng.randint(7 * 4, 10 * 4) * 15
        brk = rng.choice([30, 45, 60])
        worked = length - brk
        total += worked
        rows.append([(day + timedelta(days=d)).strftime("%a %Y-%m-%d"), hm(start), hm(start + length),
                     f"{brk} min", f"{worked / 60:.2f}", rng.choice(TASKS)])
    rate = rng.choice([2850, 3400, 4125, 5200, 6475])
    overtime = max(0, total - 40 * 60)
    pay = round(min(total, 40 * 60) * rate / 60 + overtime * rate * 1.5 / 60)
    rows.append(["**Week**", "", "", "", f"**{total / 60:.2f}**", ""])
    return (f"### Timesheet, {name}, week of {day.strftime('%d %B %Y')}\n\n"
            + table(["Day", "Start", "End", "Break", "Hours", "Main task"], rows, ["l", "r", "r", "r", "r", "l"]) +
            f"\n\nTotal worked: {duration(total)} ({total / 60:.2f} h), of which {overtime / 60:.2f} h overtime at "
            f"1.5×. At {money(rate)} per hour the gross pay for the week is {money(pay)}.\n")


def budget(rng: random.Random) -> str:
    depts = rng.sample(DEPARTMENTS, rng.randint(5, 7))
    fy = rng.randint(2018, 2025)
    rows = []
    alloc_total = spent_total = 0
    for d in depts:
        alloc = rng.randint(8, 240) * 5000
        spent = round(alloc * rng.uniform(0.55, 1.08) / 100) * 100
        alloc_total += alloc
        spent_total += spent
        rows.append([d, f"{alloc:,}", f"{spent:,}", f"{alloc - spent:,}", f"{spent / alloc * 100:.1f}%"])
    rows.append(["**Total**", f"**{alloc_total:,}**", f"**{spent_total:,}**", f"**{alloc_total - spent_total:,}**",
                 f"**{spent_total / alloc_total * 100:.1f}%**"])
    over = [d for d, r in zip(depts, rows) if r[3].startswith("-")]
    note = (f"{', '.join(over)} {'is' if len(over) == 1 else 'are'} over budget."
            if over else "No department has exceeded its allocation.")
    return (f"### FY{fy} budget to date (EUR)\n\n"
            + table(["Department", "Allocated", "Spent", "Remaining", "Used"], rows) +
            f"\n\n{spent_total / alloc_total * 100:.1f}% of the €{alloc_total:,} budget has been spent, leaving "
            f"€{alloc_total - spent_total:,}. {note}\n")


def population(rng: random.Random) -> str:
    names = rng.sample(["Ashbury", "Brenton", "Calder Falls", "Dunmore", "Eastleigh", "Farrow", "Glenpark",
                        "Holloway", "Ironbridge", "Juniper Bay", "Kestrel", "Longmead"], rng.randint(5, 7))
    y0 = rng.choice([2000, 2005, 2010])
    y1 = y0 + 10
    rows = []
    p0s, p1s = [], []
    for n in names:
        p0 = rng.randint(4000, 420000)
        p1 = round(p0 * (1 + rng.uniform(-0.06, 0.22)))
        area = round(rng.uniform(12, 480), 1)
        p0s.append(p0)
        p1s.append(p1)
        rows.append([n, f"{p0:,}", f"{p1:,}", f"{(p1 - p0) / p0 * 100:+.1f}%", f"{area:,.1f}", f"{p1 / area:,.0f}"])
    t0, t1 = sum(p0s), sum(p1s)
    cagr = ((t1 / t0) ** (1 / 10) - 1) * 100
    rows.append(["**County**", f"**{t0:,}**", f"**{t1:,}**", f"**{(t1 - t0) / t0 * 100:+.1f}%**", "", ""])
    return (f"### Census population, {y0} and {y1}\n\n"
            + table(["Town", str(y0), str(y1), "Change", "Area km²", f"Density {y1} /km²"], rows) +
            f"\n\nThe county grew from {t0:,} to {t1:,} residents, a compound annual rate of {cagr:.2f}%.\n")


GENERATORS = [quarterly_sales, league_standings, train_timetable, weather, csv_block, invoice, conversions,
              lab_measurements, science_lines, survey, stock_prices, timesheet, budget, population]


def generate(seed: int, min_chars: int) -> str:
    rng = random.Random(seed)
    blocks: list[str] = []
    size = 0
    while size < min_chars:
        order = GENERATORS[:]
        rng.shuffle(order)
        for gen in order:
            block = gen(rng)
            blocks.append(block)
            size += len(block) + 1
            if size >= min_chars:
                break
    return "\n".join(blocks)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seed", type=int, required=True, help="1101 for held-out, 2202 for calibration")
    ap.add_argument("--min-chars", type=int, default=16000, help="stop after the block that reaches this size")
    ap.add_argument("--out", type=Path, help="file to write (default: stdout)")
    args = ap.parse_args()
    text = generate(args.seed, args.min_chars)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text, encoding="utf-8", newline="\n")
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main()
