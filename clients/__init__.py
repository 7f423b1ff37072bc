"""Programs that run on the user's machines. They import nothing from the server."""
