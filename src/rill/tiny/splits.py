"""What rill-tiny may see in training and what only its evaluation sees.

Held out of training: number pairs, real words and (city, timezone) pairs chosen by a stable
hash, plus every value that appears in the issue's examples, so the evaluation measures
generalisation rather than recall. Training words are the other real words and random letter
strings, filtered so that no held-out word (or its reversal) is ever produced.
"""

from __future__ import annotations

import random
import re
import string
import zlib
from functools import cache

TRAIN = "train"
EVAL = "eval"

# The values quoted in the issue are always held out.
EXAMPLE_PAIRS = frozenset({(347, 58), (512, 77)})
EXAMPLE_WORDS = frozenset({"stream", "banana", "hello", "world"})
EXAMPLE_CITIES = frozenset({"Tokyo", "Paris"})

_WORDS = """
apple river mountain garden window pencil orange purple silver golden rabbit turtle dragon
castle bridge forest island ocean desert valley candle mirror basket pillow blanket ladder
hammer button rocket planet comet galaxy thunder lightning rainbow winter summer autumn spring
monday friday morning evening shadow sunset harbor anchor sailor pirate captain soldier farmer
doctor teacher student artist singer dancer writer reader builder driver player keeper hunter
kitten puppy monkey donkey tiger lion zebra giraffe camel horse sheep goat chicken duck goose
eagle falcon parrot pigeon sparrow salmon shark whale dolphin octopus lobster spider beetle
butterfly cherry grape lemon melon peach pear plum mango papaya coconut carrot potato tomato
onion garlic pepper ginger butter cheese bread cookie muffin pancake waffle noodle pizza pasta
soup salad coffee cotton velvet marble granite copper nickel iron cobalt carbon oxygen helium
neon argon piano guitar violin trumpet flute drum cello harp banjo jacket sweater shirt trousers
boots sandal helmet glove scarf wallet ticket letter parcel envelope stamp marker eraser ruler
folder paper notebook magnet engine wheel pedal saddle wagon tractor canoe kayak yacht ferry
tunnel tower temple palace cottage cabin tent barn stable fence gate door roof floor ceiling
kitchen bedroom attic cellar balcony meadow prairie jungle swamp canyon glacier volcano crater
pebble boulder crystal diamond emerald ruby pearl amber ivory jade coral lantern torch compass
clock calendar puzzle riddle secret mystery legend story poem song music rhythm melody chorus
circle square triangle sphere cube cylinder angle corner center border margin pocket zipper
feather wing beak claw paw tail horn hoof shell scale bubble droplet puddle pond lake creek
canal fountain shower towel soap brush comb razor needle thread ribbon string rope chain lock
key box jar cup plate bowl spoon fork knife kettle oven fridge sink table chair sofa bench
stool desk shelf drawer closet carpet curtain lamp bulb switch socket cable signal network
screen pixel cursor keyboard mouse printer scanner camera radio phone tablet laptop server
silent gentle brave clever quiet happy sunny windy stormy frozen bright dark heavy light
simple quick slow tiny giant ancient modern narrow wide deep shallow smooth rough sharp dull
sweet sour bitter salty spicy fresh stale clean dirty empty full early late round flat
jump run walk swim climb dance sing read write draw paint build carry throw catch kick push
pull lift drop spin roll slide float sink fly crawl whisper shout laugh smile frown blink
listen watch learn teach travel explore wander gather scatter borrow follow answer question
yellow green blue black white brown violet indigo crimson scarlet maroon navy teal olive
friend family mother father sister brother cousin uncle aunt neighbor stranger guest host
king queen prince knight wizard giant fairy ghost robot alien zombie hero villain rebel
market office school library museum theater stadium airport station hotel hospital bakery
"""

# (city, IANA timezone) pairs: the city is used by get_weather, the zone by get_time.
CITY_ZONES = (
    ("Tokyo", "Asia/Tokyo"), ("Paris", "Europe/Paris"), ("London", "Europe/London"),
    ("Berlin", "Europe/Berlin"), ("Madrid", "Europe/Madrid"), ("Rome", "Europe/Rome"),
    ("Amsterdam", "Europe/Amsterdam"), ("Vienna", "Europe/Vienna"), ("Prague", "Europe/Prague"),
    ("Warsaw", "Europe/Warsaw"), ("Stockholm", "Europe/Stockholm"), ("Oslo", "Europe/Oslo"),
    ("Helsinki", "Europe/Helsinki"), ("Lisbon", "Europe/Lisbon"), ("Dublin", "Europe/Dublin"),
    ("Athens", "Europe/Athens"), ("Istanbul", "Europe/Istanbul"), ("Moscow", "Europe/Moscow"),
    ("Zurich", "Europe/Zurich"), ("Brussels", "Europe/Brussels"), ("Copenhagen", "Europe/Copenhagen"),
    ("Budapest", "Europe/Budapest"), ("New York", "America/New_York"), ("Chicago", "America/Chicago"),
    ("Denver", "America/Denver"), ("Los Angeles", "America/Los_Angeles"),
    ("Toronto", "America/Toronto"), ("Vancouver", "America/Vancouver"),
    ("Mexico City", "America/Mexico_City"), ("Sao Paulo", "America/Sao_Paulo"),
    ("Lima", "America/Lima"), ("Bogota", "America/Bogota"), ("Santiago", "America/Santiago"),
    ("Seoul", "Asia/Seoul"), ("Shanghai", "Asia/Shanghai"), ("Hong Kong", "Asia/Hong_Kong"),
    ("Singapore", "Asia/Singapore"), ("Bangkok", "Asia/Bangkok"), ("Jakarta", "Asia/Jakarta"),
    ("Manila", "Asia/Manila"), ("Kolkata", "Asia/Kolkata"), ("Dubai", "Asia/Dubai"),
    ("Tehran", "Asia/Tehran"), ("Karachi", "Asia/Karachi"), ("Taipei", "Asia/Taipei"),
    ("Cairo", "Africa/Cairo"), ("Lagos", "Africa/Lagos"), ("Nairobi", "Africa/Nairobi"),
    ("Johannesburg", "Africa/Johannesburg"), ("Casablanca", "Africa/Casablanca"),
    ("Sydney", "Australia/Sydney"), ("Melbourne", "Australia/Melbourne"),
    ("Perth", "Australia/Perth"), ("Auckland", "Pacific/Auckland"),
    ("Honolulu", "Pacific/Honolulu"), ("Reykjavik", "Atlantic/Reykjavik"),
    ("Boston", "America/New_York"), ("Seattle", "America/Los_Angeles"), ("Miami", "America/New_York"),
    ("Kyoto", "Asia/Tokyo"), ("Osaka", "Asia/Tokyo"), ("Munich", "Europe/Berlin"),
    ("Hamburg", "Europe/Berlin"), ("Lyon", "Europe/Paris"), ("Barcelona", "Europe/Madrid"),
    ("Milan", "Europe/Rome"), ("Naples", "Europe/Rome"), ("Porto", "Europe/Lisbon"),
    ("Edinburgh", "Europe/London"), ("Krakow", "Europe/Warsaw"), ("Geneva", "Europe/Zurich"),
    ("Montreal", "America/Toronto"), ("Mumbai", "Asia/Kolkata"), ("Beijing", "Asia/Shanghai"),
    ("Hanoi", "Asia/Bangkok"), ("Havana", "America/Havana"), ("Quito", "America/Guayaquil"),
    ("Accra", "Africa/Accra"), ("Tunis", "Africa/Tunis"), ("Brisbane", "Australia/Brisbane"),
)


def _stable_bucket(text: str, buckets: int) -> int:
    return zlib.crc32(text.encode()) % buckets


@cache
def real_words() -> tuple[str, ...]:
    return tuple(sorted(set(_WORDS.split())))


@cache
def eval_words() -> frozenset[str]:
    """About one real word in five, plus the issue's examples, but none that the fixed sentences use."""
    from rill.tiny.tasks import fixed_texts  # tasks samples from this module

    in_templates = {w.lower() for text in fixed_texts() for w in re.findall(r"[A-Za-z]+", text)}
    chosen = {w for w in real_words() if _stable_bucket(w, 5) == 0} - in_templates
    return frozenset(chosen | EXAMPLE_WORDS)


@cache
def train_words() -> tuple[str, ...]:
    return tuple(w for w in real_words() if w not in eval_words())


@cache
def eval_cities() -> frozenset[str]:
    chosen = {c for c, _ in CITY_ZONES if _stable_bucket(c, 5) == 0}
    return frozenset(chosen | EXAMPLE_CITIES)


@cache
def eval_zones() -> frozenset[str]:
    """A zone is held out when any of its cities is: "Asia/Tokyo" would otherwise leak "Tokyo"."""
    return frozenset(z for c, z in CITY_ZONES if c in eval_cities() or z.split("/")[-1].replace("_", " ") in eval_cities())


_REGIONS = ("Europe", "Asia", "America", "Africa", "Australia", "Pacific", "Atlantic")
_ONSETS = ("b", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "ch", "gr", "kr", "st", "tr", "sh")
_NUCLEI = ("a", "e", "i", "o", "u", "ai", "ou", "ia")
_CODAS = ("", "", "", "n", "r", "s", "l", "m", "k")
SYNTHETIC_PLACE_SHARE = 0.6  # training places that are invented names, not the ~60 real training cities


def _invented_word(rng: random.Random) -> str:
    syllables = (rng.choice(_ONSETS) + rng.choice(_NUCLEI) + rng.choice(_CODAS) for _ in range(rng.choice((1, 2, 2, 2, 3))))
    return "".join(syllables).capitalize()


def _invented_place(rng: random.Random) -> str:
    """A made-up city name ("Brailon", "Kou Semar"): too many to memorise, so a model that has to
    echo the place back into a tool call or an answer learns to copy it from the question."""
    while True:
        name = " ".join(_invented_word(rng) for _ in range(rng.choice((1, 1, 1, 2))))
        if all(_is_clean_train_word(w) for w in name.split()):
            return name


def sample_city(rng: random.Random, split: str) -> str:
    if split == TRAIN and rng.random() < SYNTHETIC_PLACE_SHARE:
        return _invented_place(rng)
    return rng.choice(cities(split))


def sample_zone(rng: random.Random, split: str) -> str:
    if split == TRAIN and rng.random() < SYNTHETIC_PLACE_SHARE:
        return f"{rng.choice(_REGIONS)}/{_invented_place(rng).replace(' ', '_')}"
    return rng.choice(zones(split))


def cities(split: str) -> tuple[str, ...]:
    held = eval_cities()
    return tuple(c for c, _ in CITY_ZONES if (c in held) == (split == EVAL))


def zones(split: str) -> tuple[str, ...]:
    held = eval_zones()
    return tuple(sorted({z for _, z in CITY_ZONES if (z in held) == (split == EVAL)}))


def is_eval_pair(a: int, b: int) -> bool:
    """One (a, b) operand pair in ten, for both + and -."""
    return (a, b) in EXAMPLE_PAIRS or _stable_bucket(f"{a},{b}", 10) == 0


def sample_operand(rng: random.Random) -> int:
    digits = rng.randint(1, 3)
    return rng.randint(0 if digits == 1 else 10 ** (digits - 1), 10**digits - 1)


def sample_pair(rng: random.Random, split: str, *, ordered: bool) -> tuple[int, int]:
    """Operands for + (any order) or - (ordered: a >= b, so the result is not negative)."""
    while True:
        a, b = sample_operand(rng), sample_operand(rng)
        if ordered and a < b:
            a, b = b, a
        if is_eval_pair(a, b) == (split == EVAL):
            return a, b


def _is_clean_train_word(word: str) -> bool:
    low = word.lower()
    held = eval_words()
    if low in held or low[::-1] in held:
        return False
    return not any(c.lower() in low for c in eval_cities())


def sample_word(rng: random.Random, split: str) -> str:
    """A word for reverse / uppercase / count: held-out real words, or training words and random strings."""
    if split == EVAL:
        return rng.choice(sorted(eval_words()))
    while True:
        if rng.random() < 0.5:
            word = rng.choice(train_words())
        else:
            word = "".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 12)))
        if rng.random() < 0.1:
            word = word.capitalize()
        if _is_clean_train_word(word):
            return word
