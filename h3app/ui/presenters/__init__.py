"""Values into what a person reads: HTML cards and tables (`render`), history in words, copy-as-CLI snippets."""
