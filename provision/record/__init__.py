"""What a built environment records about itself: its manifest and its activation script."""
