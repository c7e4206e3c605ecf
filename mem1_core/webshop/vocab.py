"""The embedded shop's vocabulary: WebShop's five categories, the product types of each,
and per type its breadcrumb, attribute pool, option groups and price band.

Attributes are the short phrases that WebShop's instructions name ("machine washable",
"gluten free", "easy to clean"); options are the clickable groups of an item page (size,
color, flavor, ...). Values are lowercase, as WebShop's loader lowercases option values.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ProductKind:
    """One product type of the embedded shop."""

    name: str
    """The type as a noun phrase, plural where shops say so ("running shoes")."""
    breadcrumb: tuple[str, ...]
    """The category path, most general first (WebShop's `product_category`, split on '›')."""
    attributes: tuple[str, ...]
    """Attribute phrases a product of this type may have."""
    options: tuple[str, ...]
    """The option value sets (keys of `OPTION_VALUES`) a product of this type offers; the
    group a page shows is `group_name(key)`."""
    price: tuple[float, float]
    """Price band in dollars: a product's price is drawn uniformly from it."""


# Option groups and their possible values. A product offers a few values of each group.
# Values within a group are chosen so that WebShop's option matcher tells them apart (a
# test checks every pair): under its token-set score "x-large" matches "large", "8.5"
# matches "8", "pack of 4" matches "pack of 6", and colour normalisation makes "navy blue"
# and "light blue" both "blue"; those would make a wrong click as good as the right one. And
# each value, bought, must match itself as goal.py compares a synthetic goal's options, the
# (group, value) pair: "white wash" cannot ("wash" holds the colour "ash", which the pair's
# words lack), so the finish is "antique white".
OPTION_VALUES: dict[str, tuple[str, ...]] = {
    "size": ("xs", "s", "m", "l", "xl", "xxl"),
    "shoe size": ("6", "7", "8", "9", "10", "11", "12", "13"),
    "color": (
        "black", "white", "navy", "grey", "red", "olive", "beige", "pink", "teal",
        "burgundy", "brown", "purple",
    ),
    "scent": ("lavender", "unscented", "coconut", "citrus", "rose", "vanilla", "eucalyptus"),
    "volume": ("30 ml", "75 ml", "150 ml", "250 ml", "400 ml"),
    "flavor": (
        "original", "sea salt", "honey", "dark chocolate", "peanut butter", "cinnamon",
        "strawberry", "barbecue",
    ),
    "pack size": ("single", "pair", "three pack", "six pack", "twelve pack"),
    "capacity": ("32gb", "64gb", "128gb", "256gb", "512gb"),
    "style": ("classic", "pro", "mini", "bundle", "travel"),
    "finish": ("natural oak", "walnut", "espresso", "antique white", "matte black", "cherry"),
    "furniture size": ("small", "medium", "large", "twin", "full", "queen", "king"),
}  # fmt: skip


# The group name a page shows for a value set, where it differs from the set's key.
_GROUP_NAMES = {"shoe size": "size", "furniture size": "size"}


def group_name(key: str) -> str:
    """The option group a value set is shown as ("shoe size" -> "size")."""
    return _GROUP_NAMES.get(key, key)


def _kinds(
    category: str, root: str, rows: list[tuple[str, str, tuple, tuple, tuple]]
) -> dict[str, list[ProductKind]]:
    return {
        category: [
            ProductKind(name, (root, branch, name), tuple(attrs), tuple(opts), price)
            for name, branch, attrs, opts, price in rows
        ]
    }


_FASHION_COMMON = ("machine washable", "lightweight", "breathable", "quick drying")
CATEGORIES: dict[str, list[ProductKind]] = {
    **_kinds(
        "fashion",
        "clothing, shoes & jewelry",
        [
            ("running shoes", "shoes", ("non slip", "rubber sole", "arch support",
             "memory foam", "lightweight", "breathable", "wide toe box", "knit upper"),
             ("shoe size", "color"), (25.0, 140.0)),
            ("hiking boots", "shoes", ("waterproof", "rubber sole", "ankle support",
             "steel toe", "non slip", "leather upper", "lace up", "insulated"),
             ("shoe size", "color"), (45.0, 190.0)),
            ("t-shirts", "tops", (*_FASHION_COMMON, "cotton", "short sleeve", "crew neck",
             "relaxed fit", "moisture wicking"), ("size", "color"), (8.0, 40.0)),
            ("hoodies", "tops", (*_FASHION_COMMON[:2], "fleece lined", "long sleeve",
             "drawstring hood", "kangaroo pocket", "cotton", "zip up"),
             ("size", "color"), (20.0, 75.0)),
            ("jeans", "bottoms", ("machine washable", "stretch", "slim fit", "high waist",
             "button closure", "straight leg", "cotton", "distressed"),
             ("size", "color"), (20.0, 90.0)),
            ("rain jackets", "outerwear", ("waterproof", "lightweight", "packable",
             "adjustable hood", "zip pockets", "windproof", "breathable", "reflective"),
             ("size", "color"), (30.0, 160.0)),
            ("wool socks", "accessories", ("moisture wicking", "cushioned", "merino wool",
             "machine washable", "arch support", "odor resistant", "crew length"),
             ("size", "color", "pack size"), (8.0, 35.0)),
        ],
    ),
    **_kinds(
        "beauty",
        "beauty & personal care",
        [
            ("face moisturizer", "skin care", ("fragrance free", "hyaluronic acid",
             "oil free", "non comedogenic", "sensitive skin", "spf 30", "vitamin c",
             "cruelty free"), ("volume", "scent"), (8.0, 60.0)),
            ("shampoo", "hair care", ("sulfate free", "paraben free", "tea tree",
             "dry hair", "color safe", "natural ingredients", "argan oil", "anti dandruff"),
             ("volume", "scent"), (6.0, 40.0)),
            ("lip balm", "skin care", ("long lasting", "shea butter", "beeswax",
             "cruelty free", "spf 15", "vegan", "tinted"), ("scent", "pack size"),
             (3.0, 20.0)),
            ("nail polish", "makeup", ("long lasting", "quick drying", "non toxic",
             "chip resistant", "high gloss", "vegan", "cruelty free"),
             ("color", "pack size"), (5.0, 25.0)),
            ("hair dryer", "hair care", ("ionic", "lightweight", "fast drying",
             "low noise", "diffuser attachment", "cool shot", "foldable handle"),
             ("color", "style"), (20.0, 120.0)),
            ("body wash", "bath & body", ("sulfate free", "natural ingredients",
             "moisturizing", "sensitive skin", "essential oils", "dermatologist tested",
             "paraben free"), ("volume", "scent"), (5.0, 30.0)),
            ("makeup brushes", "makeup", ("synthetic bristles", "cruelty free",
             "travel size", "easy to clean", "soft bristles", "storage case",
             "wooden handle"), ("color", "pack size"), (8.0, 45.0)),
        ],
    ),
    **_kinds(
        "electronics",
        "electronics",
        [
            ("wireless earbuds", "headphones", ("noise cancelling", "bluetooth 5.3",
             "water resistant", "long battery life", "charging case", "built in microphone",
             "touch control", "fast charging"), ("color", "style"), (18.0, 180.0)),
            ("phone charger", "accessories", ("fast charging", "usb c", "wall mount",
             "compact design", "dual port", "overheat protection", "braided cable"),
             ("color", "pack size"), (8.0, 45.0)),
            ("memory card", "storage", ("high speed", "water resistant", "adapter included",
             "4k video", "shock proof", "read speed 170mb/s"), ("capacity", "pack size"),
             (6.0, 80.0)),
            ("bluetooth speaker", "audio", ("waterproof", "long battery life", "portable",
             "deep bass", "built in microphone", "stereo pairing", "shockproof"),
             ("color", "style"), (20.0, 150.0)),
            ("laptop stand", "computer accessories", ("adjustable height", "aluminum alloy",
             "foldable", "heat dissipation", "non slip", "portable", "ergonomic"),
             ("color", "style"), (15.0, 70.0)),
            ("usb flash drive", "storage", ("high speed", "usb 3.0", "metal casing",
             "keychain", "plug and play", "dual connector"), ("capacity", "pack size"),
             (6.0, 60.0)),
            ("smart watch", "wearables", ("heart rate monitor", "sleep tracking",
             "water resistant", "long battery life", "gps", "touch screen",
             "blood oxygen"), ("color", "style"), (30.0, 250.0)),
        ],
    ),
    **_kinds(
        "food",
        "grocery & gourmet food",
        [
            ("granola bars", "snacks", ("gluten free", "high protein", "low sugar",
             "non gmo", "whole grain", "individually wrapped", "kosher"),
             ("flavor", "pack size"), (5.0, 35.0)),
            ("potato chips", "snacks", ("gluten free", "kettle cooked", "non gmo",
             "low sodium", "vegan", "family size", "no artificial flavors"),
             ("flavor", "pack size"), (3.0, 30.0)),
            ("ground coffee", "beverages", ("medium roast", "dark roast", "organic",
             "fair trade", "single origin", "low acid", "decaf"), ("flavor", "pack size"),
             (7.0, 45.0)),
            ("herbal tea", "beverages", ("caffeine free", "organic", "non gmo",
             "individually wrapped", "natural ingredients", "kosher", "sugar free"),
             ("flavor", "pack size"), (4.0, 30.0)),
            ("trail mix", "snacks", ("high protein", "no artificial flavors", "resealable bag",
             "gluten free", "keto friendly", "roasted nuts", "non gmo"),
             ("flavor", "pack size"), (5.0, 35.0)),
            ("dark chocolate", "candy", ("sugar free", "organic", "fair trade", "vegan",
             "keto friendly", "individually wrapped", "gluten free"),
             ("flavor", "pack size"), (4.0, 40.0)),
            ("olive oil", "pantry", ("extra virgin", "cold pressed", "organic",
             "non gmo", "glass bottle", "single origin", "kosher"), ("volume", "pack size"),
             (8.0, 55.0)),
        ],
    ),
    **_kinds(
        "furniture",
        "home & kitchen",
        [
            ("office chair", "furniture", ("lumbar support", "adjustable height",
             "breathable mesh", "swivel", "padded armrests", "easy assembly",
             "high back"), ("color", "style"), (60.0, 320.0)),
            ("bookshelf", "furniture", ("easy assembly", "solid wood", "5 tier",
             "space saving", "wall anchor", "adjustable shelves", "industrial style"),
             ("finish", "furniture size"), (40.0, 260.0)),
            ("coffee table", "living room", ("storage shelf", "solid wood",
             "easy assembly", "lift top", "rustic style", "tempered glass", "round tabletop"),
             ("finish", "furniture size"), (50.0, 300.0)),
            ("bed frame", "bedroom", ("no box spring needed", "easy assembly",
             "under bed storage", "metal frame", "upholstered headboard", "noise free",
             "solid wood"), ("finish", "furniture size"), (90.0, 480.0)),
            ("throw pillows", "decor", ("machine washable", "hidden zipper",
             "soft velvet", "insert included", "double sided", "cotton linen"),
             ("color", "pack size"), (10.0, 50.0)),
            ("area rug", "decor", ("non slip", "machine washable", "stain resistant",
             "low pile", "non shedding", "pet friendly", "boho style"),
             ("color", "furniture size"), (25.0, 280.0)),
            ("desk lamp", "lighting", ("dimmable", "usb charging port", "eye caring",
             "touch control", "adjustable arm", "energy efficient", "memory function"),
             ("color", "style"), (15.0, 80.0)),
        ],
    ),
}  # fmt: skip

# Words for titles, descriptions, features and reviews.
AUDIENCES: dict[str, tuple[str, ...]] = {
    "fashion": ("for men", "for women", "for kids", "unisex"),
    "beauty": ("for women", "for men", "for all skin types", ""),
    "electronics": ("for iphone", "for android", "for laptop", "for travel", ""),
    "food": ("snack pack", "value size", "gift box", ""),
    "furniture": ("for living room", "for bedroom", "for home office", "for small spaces"),
}
PRAISE = ("great", "excellent", "solid", "nice", "decent", "fantastic")
REVIEW_VERDICTS = (
    "would buy again",
    "worth the price",
    "arrived quickly",
    "exactly as described",
    "a bit smaller than expected",
    "good value for the money",
)
