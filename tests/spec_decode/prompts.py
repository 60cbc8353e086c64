"""Prompts for the speculative-decoding tests: 16 whose answers copy spans of the prompt (repeat,
reformat or edit a passage) and 16 open-ended ones, written for these tests."""

PASSAGES = [
    "The harbor town of Elsmere sits at the mouth of the Wren river. Its fishing fleet of forty boats leaves "
    "before dawn and returns by noon, and the market opens as soon as the first boat is tied up.",
    "To reset the router, hold the power button for ten seconds, wait until the blue light blinks twice, "
    "then connect a cable to port one and open the setup page in a browser.",
    "Maria planted tomatoes in April, beans in May and pumpkins in June. By September the garden had given "
    "her more vegetables than her family could eat, so she gave the rest to her neighbours.",
    "def total_price(items):\n    total = 0\n    for item in items:\n        total = total + item.price * item.count\n"
    "    return total\n",
]
TASKS = [
    "Repeat the following text exactly, word for word:\n\n{}",
    "Copy this text and put each sentence on its own line:\n\n{}",
    "Rewrite the following text, keeping every word the same but in capital letters only where a sentence "
    "starts:\n\n{}",
    "Quote the text below back to me inside double quotes:\n\n{}",
]
OPEN_ENDED = [
    "Write a short poem about autumn.", "Tell me a story about a dragon who loves tea.",
    "Why is the sky blue?", "Give three tips for learning to cook.", "What is a black hole?",
    "Describe your ideal weekend.", "Explain how a bicycle works.", "What makes a good friend?",
    "Invent a new holiday and describe it.", "How do bees make honey?", "Write a limerick about a cat.",
    "What are the benefits of walking?", "Describe the ocean to someone who has never seen it.",
    "Suggest a name for a bakery and explain it.", "What would you take to a desert island?",
    "Write the opening line of a mystery novel.",
]


def conversations() -> list:
    """32 chat conversations: 16 input-grounded, then 16 open-ended."""
    grounded = [task.format(passage) for task in TASKS for passage in PASSAGES]
    return [[{"role": "user", "content": text}] for text in grounded + OPEN_ENDED]
