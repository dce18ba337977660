"""The texts make_dataset.py composes its tasks from: sentences, topics, questions, greetings,
code snippets (functions with and without type hints), names, cities, items and docstrings, all
written for this project."""

from __future__ import annotations

SENTENCES = [
    "The library opens at nine in the morning and closes at six in the evening.",
    "Our team moved the weekly planning meeting from Monday to Tuesday afternoon.",
    "Please remember to water the tomato plants before the weekend starts.",
    "The new bicycle lane along the river makes the commute much safer.",
    "Every student should bring a calculator and two pencils to the exam.",
    "The bakery on the corner sells fresh bread until the early afternoon.",
    "We measured the temperature of the water every hour during the experiment.",
    "The museum is planning a special exhibition about ancient navigation tools.",
    "Our server restarts automatically when the memory usage gets too high.",
    "The quarterly report shows that sales grew faster than we expected.",
    "She finished reading the whole novel during a single rainy weekend.",
    "The train to the coast leaves from platform four every thirty minutes.",
    "Good documentation saves new contributors many hours of confusion.",
    "The committee approved the budget after a long and careful discussion.",
    "Children in the village learn to swim in the lake during the summer.",
    "The software update fixes several problems with the printing feature.",
    "Our neighbours organised a small concert in the courtyard last Friday.",
    "The recipe needs two eggs, a cup of flour and a pinch of salt.",
    "Remote work gives many people more time with their families.",
    "The mountain path is closed in winter because of heavy snow.",
    "A good night of sleep improves concentration and memory.",
    "The city council wants to plant three hundred trees next spring.",
    "Their startup builds tools that help farmers predict the weather.",
    "The old bridge was repaired and painted a bright shade of green.",
    "Volunteers cleaned the beach and collected forty bags of plastic.",
    "The conference talks will be recorded and published online next week.",
    "My grandmother still writes letters by hand to her old friends.",
    "The orchestra rehearsed the final movement until late in the evening.",
    "Regular backups protect the company against accidental data loss.",
    "The hotel offers breakfast on the terrace when the weather is nice.",
]

TOPICS = {
    "recursion": (
        "a function that calls itself on a smaller part of the problem",
        "every recursive function needs a base case that stops the calls",
        "tree traversal and divide and conquer algorithms use it naturally",
    ),
    "caching": (
        "keeping the result of an expensive computation to reuse it later",
        "a cache trades memory for speed",
        "the hard part is deciding when a cached value is out of date",
    ),
    "unit tests": (
        "small checks that one piece of code does what it promises",
        "they run fast and point to the exact place that broke",
        "a good test fails when the behaviour it checks is wrong",
    ),
    "photosynthesis": (
        "the process plants use to turn light into chemical energy",
        "it takes in carbon dioxide and water and releases oxygen",
        "it happens mostly in the leaves, inside the chloroplasts",
    ),
    "compound interest": (
        "interest earned on both the money you saved and earlier interest",
        "it makes savings grow faster the longer they stay invested",
        "small regular deposits add up to a lot over many years",
    ),
    "version control": (
        "a record of every change made to a set of files",
        "it lets a team work on the same code without overwriting each other",
        "you can go back to any earlier version when something breaks",
    ),
    "the water cycle": (
        "the path water takes between the oceans, the air and the land",
        "the sun evaporates water, which condenses into clouds",
        "rain and snow bring it back to rivers, lakes and the sea",
    ),
    "hash tables": (
        "a structure that finds a value from its key in about constant time",
        "a hash function turns the key into a position in an array",
        "collisions are handled with chaining or open addressing",
    ),
    "time zones": (
        "regions of the world that share the same standard time",
        "they exist so that noon is roughly when the sun is highest",
        "software should store times in UTC and convert them for display",
    ),
    "binary search": (
        "a way to find an item in a sorted list by halving the range",
        "each step compares the middle element with the target",
        "it needs about log2(n) steps for a list of n items",
    ),
    "vaccines": (
        "a way to train the immune system without causing the disease",
        "they show the body a harmless piece or form of a germ",
        "the body then remembers how to fight the real infection",
    ),
    "garbage collection": (
        "automatic freeing of memory a program no longer uses",
        "the runtime finds objects nothing refers to any more",
        "it spares programmers manual memory management at some cost",
    ),
}

QUESTIONS = [
    "Can you explain {t} in simple terms?",
    "What is {t}? Please keep it short.",
    "I keep hearing about {t}. What is it and why does it matter?",
    "Explain {t} to a twelve year old.",
    "Give me a quick overview of {t}.",
]

GREETINGS = [
    (
        "Hi! How are you today?",
        "Hello! I'm doing well, thank you for asking. How can I help you today?",
    ),
    (
        "Good morning!",
        "Good morning! I hope your day is off to a great start. What can I do for you?",
    ),
    (
        "Thanks, that was helpful.",
        "You're welcome! I'm glad it helped. Let me know if you have any other questions.",
    ),
    (
        "Can you tell me a short joke?",
        "Sure! Why did the developer go broke? Because he used up all his cache.",
    ),
    ("Say hello in three languages.", "Hello in English, Bonjour in French and Hola in Spanish."),
]

# (source with hint slots {a0}, {a1}, ... and {r}; the hints; a local variable; its new name)
FUNCTIONS = [
    (
        "def mean(values{a0}){r}:\n    total = 0\n    for value in values:\n        total += "
        "value\n    return total / len(values)\n",
        [": list[float]"],
        " -> float",
        "total",
        "running_sum",
    ),
    (
        "def count_words(text{a0}){r}:\n    counts = {{}}\n    for word in text.split():\n"
        "        word = word.lower()\n        counts[word] = counts.get(word, 0) + 1\n"
        "    return counts\n",
        [": str"],
        " -> dict[str, int]",
        "counts",
        "word_counts",
    ),
    (
        "def clamp(x{a0}, low{a1}, high{a2}){r}:\n    if x < low:\n        return low\n"
        "    if x > high:\n        return high\n    return x\n",
        [": int", ": int", ": int"],
        " -> int",
        "x",
        "value",
    ),
    (
        "def read_lines(path{a0}, skip_empty{a1}=True){r}:\n    result = []\n    with open(path) "
        "as f:\n        for line in f:\n            line = line.rstrip()\n"
        "            if skip_empty and not line:\n                continue\n"
        "            result.append(line)\n    return result\n",
        [": str", ": bool"],
        " -> list[str]",
        "result",
        "lines",
    ),
    (
        "def merge_sorted(a{a0}, b{a1}){r}:\n    i = j = 0\n    out = []\n    while i < len(a) "
        "and j < len(b):\n        if a[i] <= b[j]:\n            out.append(a[i])\n            "
        "i += 1\n        else:\n            out.append(b[j])\n            j += 1\n    return out "
        "+ a[i:] + b[j:]\n",
        [": list[int]", ": list[int]"],
        " -> list[int]",
        "out",
        "merged",
    ),
    (
        "def find_user(users{a0}, name{a1}){r}:\n    for user in users:\n        if user['name'] "
        "== name:\n            return user\n    return None\n",
        [": list[dict]", ": str"],
        " -> dict | None",
        "user",
        "candidate",
    ),
    (
        "def celsius_to_fahrenheit(c{a0}){r}:\n    f = c * 9 / 5 + 32\n    return round(f, 1)\n",
        [": float"],
        " -> float",
        "f",
        "fahrenheit",
    ),
    (
        "def chunk(items{a0}, size{a1}){r}:\n    chunks = []\n    for start in range(0, "
        "len(items), size):\n        chunks.append(items[start:start + size])\n    return chunks\n",
        [": list", ": int"],
        " -> list[list]",
        "chunks",
        "pieces",
    ),
    (
        "def is_palindrome(s{a0}){r}:\n    cleaned = ''.join(ch.lower() for ch in s if "
        "ch.isalnum())\n    return cleaned == cleaned[::-1]\n",
        [": str"],
        " -> bool",
        "cleaned",
        "normalized",
    ),
    (
        "def total_price(cart{a0}, tax_rate{a1}){r}:\n    subtotal = sum(item['price'] * "
        "item['qty'] for item in cart)\n    tax = subtotal * tax_rate\n    return subtotal + tax\n",
        [": list[dict]", ": float"],
        " -> float",
        "subtotal",
        "net_total",
    ),
    (
        "def parse_version(text{a0}){r}:\n    parts = text.strip().split('.')\n    return "
        "tuple(int(p) for p in parts)\n",
        [": str"],
        " -> tuple[int, ...]",
        "parts",
        "fields",
    ),
    (
        "def retry(fn{a0}, attempts{a1}=3){r}:\n    last_error = None\n    for n in "
        "range(attempts):\n        try:\n            return fn()\n"
        "        except Exception as exc:\n"
        "            last_error = exc\n    raise last_error\n",
        [": Callable[[], T]", ": int"],
        " -> T",
        "last_error",
        "previous_error",
    ),
]

FIRST = [
    "Alice",
    "Bruno",
    "Chen",
    "Dana",
    "Emil",
    "Fatima",
    "Goran",
    "Hana",
    "Ivo",
    "Jonas",
    "Keiko",
    "Lena",
    "Mateo",
    "Nora",
    "Omar",
    "Priya",
]
CITIES = ["Lyon", "Porto", "Osaka", "Leeds", "Tartu", "Graz", "Cork", "Malmo", "Bergen", "Turin"]
ITEMS = [
    "apples",
    "notebooks",
    "batteries",
    "coffee beans",
    "light bulbs",
    "paint brushes",
    "tea bags",
    "envelopes",
    "scissors",
    "candles",
    "rice",
    "stamps",
]


DOCS = {
    "mean": "Return the arithmetic mean of the values.",
    "count_words": "Count how often each lower-cased word appears in the text.",
    "clamp": "Limit x to the range from low to high.",
    "read_lines": "Read the file's lines without their line endings.",
    "merge_sorted": "Merge two sorted lists into one sorted list.",
    "find_user": "Return the first user with this name, or None.",
    "celsius_to_fahrenheit": "Convert degrees Celsius to Fahrenheit, rounded to 0.1.",
    "chunk": "Split the items into lists of at most size items.",
    "is_palindrome": "Tell whether s reads the same backwards, ignoring case and punctuation.",
    "total_price": "Return the cart's total including tax.",
    "parse_version": "Turn a version string such as '1.2.3' into a tuple of integers.",
    "retry": "Call fn up to attempts times and return its first result.",
}
