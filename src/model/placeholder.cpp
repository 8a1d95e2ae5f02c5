// Placeholder so the library has a source until its real files land; delete then.
