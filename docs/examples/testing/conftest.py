pytest_plugins = ["threadmill.testing.pytest"]
