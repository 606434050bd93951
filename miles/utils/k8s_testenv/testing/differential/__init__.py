"""The differential harness: our `ReconcileLoop` beside client-go's Reflector and Store."""
