"""AskUserQuestion inputs as Claude Code sends them, shared by the bridge tests."""

FRAMEWORK = {
    "question": "Which framework?",
    "header": "Framework",
    "options": [{"label": "React", "description": "SPA"}, {"label": "Vue", "description": "SPA"}],
    "multiSelect": False,
}
FEATURES = {
    "question": "Which features?",
    "header": "Features",
    "options": [
        {"label": "Auth", "description": "login"},
        {"label": "Search", "description": "full text"},
        {"label": "Export", "description": "CSV"},
    ],
    "multiSelect": True,
}
