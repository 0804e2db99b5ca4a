"""Vocabulary of the generated WebShop catalogue: categories, product types, attributes, options.

Every product type names its noun phrase (what a shopper asks for), the search query and category
path it is filed under, a price band and the option groups it comes in. Attribute phrases are the
kind the original instructions use ("natural looking", "gluten free", "machine washable").
"""

from __future__ import annotations

# Option groups: option name shown on the item page -> the values a product may offer.
OPTION_POOLS: dict[str, tuple[str, list[str]]] = {
    "color": ("color", ["black", "white", "navy blue", "grey", "red", "pink", "beige", "brown",
                        "green", "purple", "gold", "silver", "rose gold", "dark brown",
                        "light blue", "khaki", "burgundy", "ivory", "teal", "charcoal grey"]),
    "hair_color": ("color", ["natural black", "dark brown", "medium brown", "ash blonde",
                             "honey blonde", "platinum blonde", "auburn", "burgundy red"]),
    "clothing_size": ("size", ["x-small", "small", "medium", "large", "x-large", "xx-large"]),
    "shoe_size": ("size", ["6", "6.5", "7", "7.5", "8", "8.5", "9", "9.5", "10", "11", "12"]),
    "hair_length": ("size", ["12 inch", "14 inch", "16 inch", "18 inch", "20 inch", "22 inch"]),
    "bed_size": ("size", ["twin", "full", "queen", "king", "california king"]),
    "volume": ("size", ["1 fl oz", "1.7 fl oz", "3.4 fl oz", "8 fl oz", "16 fl oz"]),
    "food_size": ("size", ["8 ounce (pack of 1)", "8 ounce (pack of 3)", "12 ounce (pack of 2)",
                           "1 pound (pack of 1)", "2 pound (pack of 1)", "5 pound (pack of 1)"]),
    "pet_size": ("size", ["4 pound bag", "8 pound bag", "15 pound bag", "30 pound bag"]),
    "scent": ("scent", ["lavender", "vanilla", "unscented", "citrus", "coconut", "fresh linen",
                        "eucalyptus mint", "sandalwood"]),
    "flavor": ("flavor name", ["chocolate", "vanilla", "strawberry", "original", "salted caramel",
                               "peanut butter", "honey", "mixed berry", "sea salt"]),
    "capacity": ("capacity", ["32gb", "64gb", "128gb", "256gb", "512gb"]),
    "quantity": ("item package quantity", ["1", "2", "3", "4", "6", "12"]),
    "device_style": ("style", ["for iphone 13", "for iphone 14", "for iphone 15",
                               "for galaxy s22", "for galaxy s23", "for pixel 7"]),
    "furniture_style": ("style", ["modern", "farmhouse", "mid century", "industrial",
                                  "scandinavian", "traditional"]),
    "pattern": ("pattern name", ["solid", "striped", "floral", "plaid", "polka dot", "geometric"]),
    "material": ("material type", ["cotton", "linen", "velvet", "leather", "microfiber"]),
}

# category key -> (department, attribute phrases, product types)
# product type: (noun phrase, search query, category path below the department,
#                (lowest price, highest price), option pool keys)
CATEGORIES: dict[str, tuple[str, list[str], list[tuple]]] = {
    "beauty": ("Beauty & Personal Care", [
        "natural looking", "long lasting", "easy to apply", "cruelty free", "paraben free",
        "sensitive skin", "travel size", "high quality", "dermatologist tested", "vegan"], [
        ("clip in hair extension", "hair extensions", "Hair Care › Hair Extensions", (15, 70),
         ("hair_color", "hair_length")),
        ("lace front wig", "wigs", "Hair Care › Wigs", (30, 150), ("hair_color", "hair_length")),
        ("face moisturizer", "moisturizer", "Skin Care › Face › Moisturizers", (8, 45),
         ("volume",)),
        ("eau de parfum", "perfume for women", "Fragrance › Women › Eau de Parfum", (20, 120),
         ("volume", "scent")),
        ("nail polish set", "nail polish", "Foot, Hand & Nail Care › Nail Polish", (6, 30),
         ("color",)),
        ("makeup brush set", "makeup brushes", "Tools & Accessories › Makeup Brushes", (9, 40),
         ("color",)),
        ("shampoo bar", "shampoo", "Hair Care › Shampoo & Conditioner", (5, 25), ("scent",)),
    ]),
    "grocery": ("Grocery & Gourmet Food", [
        "gluten free", "sugar free", "non gmo", "low carb", "keto friendly", "plant based",
        "high protein", "usda organic", "kosher", "dairy free"], [
        ("protein powder", "protein powder", "Sports Nutrition › Protein › Whey", (18, 70),
         ("flavor", "food_size")),
        ("granola bar", "granola bars", "Snack Foods › Bars › Granola", (5, 30),
         ("flavor", "quantity")),
        ("coffee creamer", "coffee creamer", "Beverages › Coffee › Creamers", (4, 25),
         ("flavor", "food_size")),
        ("almond butter", "nut butter", "Pantry Staples › Nut Butters", (7, 30),
         ("flavor", "food_size")),
        ("herbal tea bags", "herbal tea", "Beverages › Tea › Herbal", (4, 22), ("quantity",)),
        ("beef jerky", "jerky", "Snack Foods › Jerky & Dried Meats", (6, 35),
         ("flavor", "food_size")),
    ]),
    "women's clothing": ("Clothing, Shoes & Jewelry", [
        "machine washable", "button closure", "long sleeve", "short sleeve", "high waist",
        "elastic waistband", "relaxed fit", "quick drying", "soft material", "pull on closure"], [
        ("maxi dress", "women dresses", "Women › Clothing › Dresses", (18, 60),
         ("color", "clothing_size")),
        ("yoga pants", "yoga leggings", "Women › Clothing › Active › Leggings", (12, 45),
         ("color", "clothing_size")),
        ("cardigan sweater", "women cardigan", "Women › Clothing › Sweaters", (20, 65),
         ("color", "clothing_size")),
        ("blouse", "women blouse", "Women › Clothing › Tops & Tees › Blouses", (14, 45),
         ("color", "clothing_size")),
        ("denim shorts", "women shorts", "Women › Clothing › Shorts", (15, 40),
         ("color", "clothing_size")),
    ]),
    "men's clothing": ("Clothing, Shoes & Jewelry", [
        "machine washable", "regular fit", "slim fit", "button closure", "moisture wicking",
        "long sleeve", "short sleeve", "zipper closure", "cotton spandex", "classic fit"], [
        ("polo shirt", "men polo", "Men › Clothing › Shirts › Polos", (14, 45),
         ("color", "clothing_size")),
        ("cargo pants", "men cargo pants", "Men › Clothing › Pants", (22, 60),
         ("color", "clothing_size")),
        ("hoodie", "men hoodie", "Men › Clothing › Fashion Hoodies & Sweatshirts", (20, 55),
         ("color", "clothing_size")),
        ("swim trunks", "men swim trunks", "Men › Clothing › Swim", (12, 35),
         ("color", "clothing_size")),
        ("dress shirt", "men dress shirt", "Men › Clothing › Shirts › Dress Shirts", (18, 50),
         ("color", "clothing_size")),
    ]),
    "shoes": ("Clothing, Shoes & Jewelry", [
        "non slip", "rubber sole", "memory foam", "arch support", "lace up", "slip on",
        "lightweight", "breathable mesh", "water resistant", "wide width"], [
        ("running shoes", "running shoes", "Shoes › Athletic › Running", (30, 110),
         ("color", "shoe_size")),
        ("ankle boots", "ankle boots", "Shoes › Boots › Ankle & Bootie", (35, 120),
         ("color", "shoe_size")),
        ("house slippers", "slippers", "Shoes › Slippers", (12, 40), ("color", "shoe_size")),
        ("sandals", "sandals", "Shoes › Sandals", (15, 55), ("color", "shoe_size")),
        ("loafers", "loafers", "Shoes › Loafers & Slip-Ons", (30, 90), ("color", "shoe_size")),
    ]),
    "furniture": ("Home & Kitchen", [
        "easy assembly", "solid wood", "storage space", "living room", "space saving",
        "metal frame", "high density foam", "button tufted", "mid century", "engineered wood"], [
        ("accent chair", "accent chair", "Furniture › Living Room › Chairs", (60, 300),
         ("color", "material")),
        ("coffee table", "coffee table", "Furniture › Living Room › Tables", (45, 260),
         ("color", "furniture_style")),
        ("bed frame", "bed frame", "Furniture › Bedroom › Beds & Frames", (90, 420),
         ("color", "bed_size")),
        ("bookshelf", "bookshelf", "Furniture › Home Office › Bookcases", (40, 220),
         ("color", "furniture_style")),
        ("bar stool", "bar stools", "Furniture › Kitchen & Dining › Bar Stools", (35, 180),
         ("color", "quantity")),
        ("tv stand", "tv stand", "Furniture › Living Room › TV & Media", (50, 280),
         ("color", "furniture_style")),
    ]),
    "home decor": ("Home & Kitchen", [
        "machine washable", "blackout", "easy to clean", "living room", "bedroom",
        "fade resistant", "soft touch", "anti slip", "handmade", "thermal insulated"], [
        ("throw pillow cover", "pillow covers", "Home Décor › Decorative Pillows", (8, 35),
         ("color", "pattern")),
        ("window curtains", "curtains", "Home Décor › Window Treatments › Curtains", (15, 70),
         ("color", "pattern")),
        ("area rug", "area rug", "Home Décor › Area Rugs", (30, 200), ("color", "pattern")),
        ("scented candle", "candles", "Home Décor › Candles", (8, 35), ("scent", "quantity")),
        ("duvet cover set", "duvet cover", "Bedding › Duvet Covers", (30, 110),
         ("color", "bed_size")),
    ]),
    "kitchen": ("Home & Kitchen", [
        "dishwasher safe", "bpa free", "non stick", "stainless steel", "easy to clean",
        "heat resistant", "leak proof", "food grade", "oven safe", "double wall"], [
        ("water bottle", "water bottle", "Kitchen & Dining › Water Bottles", (10, 40),
         ("color", "volume")),
        ("frying pan", "frying pan", "Kitchen & Dining › Cookware › Skillets", (18, 80),
         ("color",)),
        ("food storage containers", "food containers", "Kitchen & Dining › Storage", (12, 45),
         ("quantity",)),
        ("coffee mug", "coffee mug", "Kitchen & Dining › Drinkware › Mugs", (8, 30),
         ("color", "quantity")),
        ("knife set", "knife set", "Kitchen & Dining › Cutlery › Knife Sets", (25, 150),
         ("color",)),
    ]),
    "electronics": ("Electronics", [
        "noise cancelling", "fast charging", "long battery life", "high definition",
        "bluetooth", "water resistant", "plug and play", "easy to carry", "hands free",
        "usb c"], [
        ("wireless earbuds", "wireless earbuds", "Headphones › Earbud Headphones", (20, 150),
         ("color",)),
        ("portable speaker", "bluetooth speaker", "Portable Audio › Speakers", (25, 130),
         ("color",)),
        ("usb microphone", "usb microphone", "Musical Instruments › Microphones", (30, 120),
         ("color",)),
        ("memory card", "memory card", "Computers › Memory Cards", (8, 60), ("capacity",)),
        ("flash drive", "usb flash drive", "Computers › USB Flash Drives", (6, 45),
         ("capacity", "quantity")),
        ("webcam", "webcam", "Computers › Webcams", (25, 110), ("color",)),
    ]),
    "cell phone accessories": ("Cell Phones & Accessories", [
        "shockproof", "slim fit", "wireless charging", "tempered glass", "scratch resistant",
        "easy installation", "fast charging", "kickstand", "anti fingerprint", "drop protection"], [
        ("phone case", "phone case", "Cases, Holsters & Sleeves › Basic Cases", (7, 35),
         ("color", "device_style")),
        ("screen protector", "screen protector", "Accessories › Screen Protectors", (5, 20),
         ("device_style", "quantity")),
        ("charging cable", "charging cable", "Accessories › Chargers › Cables", (6, 25),
         ("color", "quantity")),
        ("car phone mount", "phone holder car", "Accessories › Car Accessories › Mounts", (10, 40),
         ("color",)),
    ]),
    "sports": ("Sports & Outdoors", [
        "non slip", "lightweight", "easy to carry", "quick drying", "adjustable", "durable",
        "high density", "eco friendly", "extra thick", "sweat resistant"], [
        ("yoga mat", "yoga mat", "Exercise & Fitness › Yoga › Mats", (15, 60), ("color",)),
        ("resistance bands", "resistance bands", "Exercise & Fitness › Strength Training",
         (9, 35), ("color", "quantity")),
        ("camping tent", "camping tent", "Outdoor Recreation › Camping › Tents", (45, 250),
         ("color",)),
        ("hiking backpack", "hiking backpack", "Outdoor Recreation › Backpacks", (25, 110),
         ("color",)),
        ("jump rope", "jump rope", "Exercise & Fitness › Cardio Training", (6, 25),
         ("color",)),
    ]),
    "pet supplies": ("Pet Supplies", [
        "grain free", "easy to clean", "machine washable", "non toxic", "natural ingredients",
        "small breed", "large breed", "chew resistant", "orthopedic", "high protein"], [
        ("dog food", "dry dog food", "Dogs › Food › Dry", (15, 80), ("flavor", "pet_size")),
        ("cat litter", "cat litter", "Cats › Litter & Housebreaking", (10, 40), ("pet_size",)),
        ("dog bed", "dog bed", "Dogs › Beds & Furniture", (20, 110),
         ("color", "clothing_size")),
        ("cat tree", "cat tree", "Cats › Cat Trees & Condos", (35, 160), ("color",)),
        ("dog leash", "dog leash", "Dogs › Collars, Harnesses & Leashes", (8, 30),
         ("color", "clothing_size")),
    ]),
    "health": ("Health & Household", [
        "non gmo", "easy to swallow", "gluten free", "vegan", "sugar free", "third party tested",
        "made in usa", "fragrance free", "hypoallergenic", "extra strength"], [
        ("vitamin d3 gummies", "vitamin d gummies", "Vitamins & Supplements › Vitamin D",
         (8, 35), ("flavor", "quantity")),
        ("fish oil softgels", "fish oil", "Vitamins & Supplements › Fish Oil", (10, 45),
         ("quantity",)),
        ("electric toothbrush", "electric toothbrush", "Oral Care › Toothbrushes", (20, 110),
         ("color",)),
        ("hand sanitizer", "hand sanitizer", "Health Care › First Aid", (4, 25),
         ("scent", "quantity")),
        ("massage gun", "massage gun", "Wellness & Relaxation › Massagers", (40, 180),
         ("color",)),
    ]),
}

# Words that make titles read like listings; their part of speech is fixed for noun tagging.
TITLE_ADJECTIVES = ["premium", "classic", "modern", "soft", "durable", "portable", "compact",
                    "elegant", "lightweight", "deluxe", "essential", "everyday"]
TITLE_AUDIENCES = {
    "beauty": ["women", "girls", "salon", "travel"],
    "grocery": ["breakfast", "snacks", "office", "family"],
    "women's clothing": ["women", "ladies", "summer", "work"],
    "men's clothing": ["men", "work", "golf", "summer"],
    "shoes": ["women", "men", "walking", "outdoor"],
    "furniture": ["home", "bedroom", "office", "apartment"],
    "home decor": ["bedroom", "home", "nursery", "farmhouse"],
    "kitchen": ["kitchen", "home", "office", "camping"],
    "electronics": ["home", "office", "gaming", "travel"],
    "cell phone accessories": ["iphone", "samsung", "car", "travel"],
    "sports": ["home", "gym", "outdoor", "travel"],
    "pet supplies": ["dogs", "cats", "puppies", "kittens"],
    "health": ["adults", "women", "men", "seniors"],
}
BRAND_SYLLABLES = ["lu", "mo", "ra", "ve", "ka", "zen", "tor", "li", "na", "so", "vi", "ar",
                   "bel", "co", "da", "fin", "gro", "hal", "ix", "jo", "quo", "rin", "sta", "ul"]
