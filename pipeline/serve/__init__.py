"""The program in front of people: asking one question, the HTTP server and its page, and the evidence-chain pages."""
